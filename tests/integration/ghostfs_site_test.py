#!/usr/bin/env python3
"""ghostfs against a site laid out like a real one: nginx without autoindex,
an index.html at the root and in subdirectories, pages, an image, a PDF, a tarball, and
directories that cannot be listed (img/, docs/). The root's page shows as index.html beside the
names it links to, the listing is marked user.ghost.listing=page with a log line, names the page
does not link to are asked of the origin (stat of an exact path works), reads are
byte-identical, and a real autoindex (pub/) stays the whole directory. TAP; skipped without
root, /dev/fuse or nginx."""
import errno
import hashlib
import os
import re
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 19

INDEX = b"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Example site</title>
<link rel="stylesheet" href="style.css"></head>
<body><h1>Welcome</h1>
<img src="img/logo.png" alt="logo">
<p>Read <a href="about.html">about us</a>, the <a href="blog/">blog</a>, or get the
<a href="downloads">downloads</a>. <a href="https://elsewhere.example/">elsewhere</a></p>
</body></html>
"""


def make_site(root):
    rng = random.Random(17)
    files = {
        "index.html": INDEX,
        "about.html": b"<html><head><title>About</title></head><body>about</body></html>\n",
        "style.css": b"body { color: black; }\n",
        "blog/index.html": b'<html><head><title>Blog</title></head><body><a href="post1.html">1</a></body></html>\n',
        "blog/post1.html": b"<html><head><title>Post 1</title></head><body>first</body></html>\n",
        "downloads/pkg-1.0.tar.gz": rng.randbytes(3 * 1024 * 1024 + 17),
        "img/logo.png": b"\x89PNG\r\n\x1a\n" + rng.randbytes(2000),
        "img/f3.jpg": b"\xff\xd8\xff\xe0" + rng.randbytes(150_000),
        "docs/manual.pdf": b"%PDF-1.4\n" + rng.randbytes(90_000),
        "docs/guide/index.html": b"<html><head><title>Guide</title></head><body>guide</body></html>\n",
        "pub/notes.txt": b"notes\n",
        "pub/data.bin": rng.randbytes(5000),
    }
    for rel, data in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    root = os.path.join(work, "site")
    os.makedirs(root)
    sums = make_site(root)
    # Like most sites: no autoindex, except one download area that has it.
    nginx = h.started_nginx(root, "location / { autoindex off; } location /pub/ { autoindex on; }")
    t = h.Tap(PLAN)
    started = time.time()
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, nginx.url(), args=["--max-stale", "0"], check="mounts")
    www = os.path.join(mnt, "www")

    names = sorted(os.listdir(www))
    want = ["about.html", "blog", "downloads", "img", "index.html", "style.css"]
    t.check(names == want, "ls of a directory serving a page: index.html and the names the page links to",
            f"{names} vs {want}")
    kind = os.getxattr(www, "user.ghost.listing").decode()
    t.check(kind == "page", "the listing is marked user.ghost.listing=page", kind)
    t.check(h.wait_for(lambda: "serves a page, not a directory listing" in fs.output(), 5),
            "a log line says the directory serves a page", fs.output()[-2000:])
    with open(os.path.join(www, "index.html"), "rb") as f:
        body = f.read()
    t.check(body == INDEX, "cat index.html gives the page the directory URL serves", body[:200])

    # An exact path the page does not link to, in a directory nginx refuses to list (403).
    try:
        st = os.stat(os.path.join(www, "img", "f3.jpg"))
        size = st.st_size
    except OSError as e:
        size = e
    t.check(size == os.path.getsize(os.path.join(root, "img/f3.jpg")),
            "stat of an unlisted exact path asks the origin (img/f3.jpg, img/ not listable)", size)
    try:
        is_dir = os.path.isdir(os.path.join(www, "docs")) and os.stat(os.path.join(www, "docs/manual.pdf")).st_size
    except OSError as e:
        is_dir = e
    t.check(is_dir == os.path.getsize(os.path.join(root, "docs/manual.pdf")),
            "an unlinked directory (docs/) and the PDF in it are found", is_dir)
    t.check(os.path.isdir(os.path.join(www, "downloads")) and os.path.isfile(os.path.join(www, "about.html")),
            "a slash-less link to a directory is a directory, a page link a file")
    try:
        os.stat(os.path.join(www, "no-such-page.html"))
        missing = "found"
    except OSError as e:
        missing = e.errno
    t.check(missing == errno.ENOENT, "a name the origin does not have is ENOENT", missing)
    names = sorted(os.listdir(www))
    t.check("docs" in names, "a name the origin confirmed joins the page's listing", names)

    bad = []
    for rel, s in sums.items():
        try:
            if h.sha256_file(os.path.join(www, rel)) != s:
                bad.append(rel)
        except OSError as e:
            bad.append(f"{rel}: {e}")
    t.check(not bad, "every file (pages, image, PDF, tarball, subdirectory index.html) reads byte-identical", bad)
    sizes = [rel for rel in sums if os.stat(os.path.join(www, rel)).st_size != os.path.getsize(os.path.join(root, rel))]
    t.check(not sizes, "stat sizes match the origin", sizes)

    # A real autoindex is the whole directory: a name it lacks is ENOENT without a request.
    pub = os.path.join(www, "pub")
    t.check(sorted(os.listdir(pub)) == ["data.bin", "notes.txt"] and
            os.getxattr(pub, "user.ghost.listing").decode() == "autoindex",
            "an autoindex lists exactly and is marked user.ghost.listing=autoindex", os.listdir(pub))
    try:
        os.stat(os.path.join(pub, "absent.txt"))
        absent = "found"
    except OSError as e:
        absent = e.errno
    asked = [line for line in nginx.log_lines() if "/pub/absent.txt" in line]
    t.check(absent == errno.ENOENT and not asked, "a name an autoindex lacks is ENOENT without asking the origin",
            f"{absent} {asked}")

    mtimes = {p: os.stat(os.path.join(www, p)).st_mtime for p in ("", "docs", "pub", "img")}
    old = {p: m for p, m in mtimes.items() if not (started - 120 < m <= time.time() + 1)}
    t.check(not old, "directories show the mount's date, not 1970", mtimes)
    t.check("user.ghost.listing" in os.listxattr(www), "listxattr of a directory names user.ghost.listing",
            os.listxattr(www))

    # ghostctl status prints the cost model's estimates readably (not JSON) unless --json.
    # The index has the PDF once its fill has left the write queue (under load, a moment after
    # the read); status costs only what the index holds.
    ghostctl = os.path.join(h.build_dir(), "fs", "ghostctl")
    deadline = time.time() + 15
    while True:
        r = subprocess.run([ghostctl, "--control", ctl, "status", os.path.join(www, "docs/manual.pdf")],
                           capture_output=True, text=True, timeout=30)
        if re.search(r"^cached +yes", r.stdout, re.M) or time.time() > deadline:
            break
        time.sleep(0.2)
    cost = [line for line in r.stdout.splitlines() if line.startswith("cost")]
    t.check(r.returncode == 0 and cost and "{" not in cost[0] and "disk" in cost[0] and " J" in cost[0],
            "ghostctl status prints its cost readably", r.stdout + r.stderr)

    # Offline, a stale cached copy is served and says so.
    nginx.stop()
    time.sleep(1.1)
    with open(os.path.join(www, "about.html"), "rb") as f:
        offline = f.read()
    source = os.getxattr(os.path.join(www, "about.html"), "user.ghost.source").decode()
    t.check(offline.startswith(b"<html>") and source == "stale",
            "offline, a stale copy served reports user.ghost.source=stale", f"{source} {offline[:60]}\n{fs.output()[-800:]}")
    fs.stop()

    # A misspelt option is blamed alone, with the near name.
    r = subprocess.run([os.path.join(h.build_dir(), "fs", "ghostfs"), "--cache", os.path.join(work, "c2"),
                        "--orgin", "www=http://127.0.0.1:1/", mnt], capture_output=True, text=True, timeout=10)
    t.check(r.returncode == 2 and "unknown option --orgin (did you mean --origin?)" in r.stderr and mnt not in r.stderr,
            "--orgin blames only the option", r.stderr)
    t.done()


if __name__ == "__main__":
    main()
