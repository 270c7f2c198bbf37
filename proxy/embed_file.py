#!/usr/bin/env python3
"""Embeds a text file in C++ as `inline constexpr char NAME[]` (build time; meson custom_target).
Usage: embed_file.py INPUT OUTPUT NAME"""
import sys

src, out, name = sys.argv[1:4]
data = open(src, "rb").read()


def escape(line):
    s = ""
    for b in line:
        c = chr(b)
        if 32 <= b < 127 and c not in '"\\?':
            s += c
        else:
            s += "\\%03o" % b  # three octal digits: never runs into the next character
    return s


with open(out, "w") as f:
    f.write("// Made from %s by proxy/embed_file.py at build time. Do not edit.\n#pragma once\n\n"
            % src.split("/")[-1])
    f.write("namespace ghost {\n\ninline constexpr char %s[] =\n" % name)
    for line in data.splitlines(keepends=True) or [b""]:
        f.write('    "%s"\n' % escape(line))
    f.write(";\n\n}  // namespace ghost\n")
