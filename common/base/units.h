// Units of the model: one type for time, one for energy, one for power, one for bandwidth.
//
// Every quantity that has a unit carries it in its type, so `Power * Duration` is an `Energy`
// and a raw double never stands for "joules, see comment". Durations are microseconds (the
// resolution of the virtual clock); energy and power are doubles inside a value type, because
// the model multiplies them by fractional seconds.
//
// Thread-safety: these are plain values.
#ifndef GHOST_COMMON_BASE_UNITS_H_
#define GHOST_COMMON_BASE_UNITS_H_

#include <chrono>
#include <compare>
#include <cstdint>

namespace ghost {

using Duration = std::chrono::microseconds;

// The epoch of a TimePoint is the start of its Clock (a run starts at zero).
struct ModelTime {};
using TimePoint = std::chrono::time_point<ModelTime, Duration>;

using Bytes = std::uint64_t;

// The longest time a user may configure or ask for, in seconds (about 31 years): far inside
// Duration's range, so converting it and adding it to any clock reading stays defined.
inline constexpr double kMaxUserSeconds = 1e9;
// Whether `s` seconds is a time a user may give: 0..kMaxUserSeconds (NaN and inf are not).
constexpr bool IsUserSeconds(double s) { return s >= 0 && s <= kMaxUserSeconds; }

// `s` must be within about ±9.2e12 (Duration's range); user input is checked with IsUserSeconds.
constexpr Duration Seconds(double s) { return Duration(static_cast<std::int64_t>(s * 1e6 + (s >= 0 ? 0.5 : -0.5))); }
constexpr Duration Millis(double ms) { return Seconds(ms / 1e3); }
constexpr double ToSeconds(Duration d) { return static_cast<double>(d.count()) / 1e6; }
constexpr double ToMillis(Duration d) { return static_cast<double>(d.count()) / 1e3; }
constexpr double ToSeconds(TimePoint t) { return ToSeconds(t.time_since_epoch()); }

class Energy;
class Power;

// Energy, stored as joules.
class Energy {
 public:
  constexpr Energy() = default;
  static constexpr Energy Joules(double j) { return Energy(j); }
  static constexpr Energy Millijoules(double mj) { return Energy(mj / 1e3); }
  constexpr double joules() const { return j_; }
  constexpr double millijoules() const { return j_ * 1e3; }

  constexpr Energy& operator+=(Energy o) { j_ += o.j_; return *this; }
  constexpr Energy& operator-=(Energy o) { j_ -= o.j_; return *this; }
  friend constexpr Energy operator+(Energy a, Energy b) { return Energy(a.j_ + b.j_); }
  friend constexpr Energy operator-(Energy a, Energy b) { return Energy(a.j_ - b.j_); }
  friend constexpr Energy operator-(Energy a) { return Energy(-a.j_); }
  friend constexpr Energy operator*(Energy a, double k) { return Energy(a.j_ * k); }
  friend constexpr Energy operator*(double k, Energy a) { return Energy(a.j_ * k); }
  friend constexpr double operator/(Energy a, Energy b) { return a.j_ / b.j_; }
  friend constexpr auto operator<=>(Energy, Energy) = default;

 private:
  explicit constexpr Energy(double j) : j_(j) {}
  double j_ = 0;
};

// Power, stored as watts.
class Power {
 public:
  constexpr Power() = default;
  static constexpr Power Watts(double w) { return Power(w); }
  static constexpr Power Milliwatts(double mw) { return Power(mw / 1e3); }
  constexpr double watts() const { return w_; }
  constexpr double milliwatts() const { return w_ * 1e3; }

  constexpr Power& operator+=(Power o) { w_ += o.w_; return *this; }
  friend constexpr Power operator+(Power a, Power b) { return Power(a.w_ + b.w_); }
  friend constexpr Power operator-(Power a, Power b) { return Power(a.w_ - b.w_); }
  friend constexpr Power operator*(Power a, double k) { return Power(a.w_ * k); }
  friend constexpr double operator/(Power a, Power b) { return a.w_ / b.w_; }
  friend constexpr auto operator<=>(Power, Power) = default;

 private:
  explicit constexpr Power(double w) : w_(w) {}
  double w_ = 0;
};

constexpr Energy operator*(Power p, Duration d) { return Energy::Joules(p.watts() * ToSeconds(d)); }
constexpr Energy operator*(Duration d, Power p) { return p * d; }
// Time a power takes to spend an energy (e.g. break-even time, DESIGN §3.2 eq. 1).
constexpr Duration operator/(Energy e, Power p) { return Seconds(e.joules() / p.watts()); }
constexpr Power operator/(Energy e, Duration d) { return Power::Watts(e.joules() / ToSeconds(d)); }

// Transfer rate, stored as bytes per second.
class Bandwidth {
 public:
  constexpr Bandwidth() = default;
  static constexpr Bandwidth BytesPerSecond(double b) { return Bandwidth(b); }
  static constexpr Bandwidth KilobytesPerSecond(double kb) { return Bandwidth(kb * 1024); }
  static constexpr Bandwidth KilobitsPerSecond(double kbit) { return Bandwidth(kbit * 1000 / 8); }
  static constexpr Bandwidth MegabitsPerSecond(double mbit) { return Bandwidth(mbit * 1e6 / 8); }
  constexpr double bytes_per_second() const { return bps_; }
  constexpr bool is_zero() const { return bps_ <= 0; }
  // Time to move `n` bytes at this rate; zero rate means "instant" (no limit).
  constexpr Duration TimeFor(Bytes n) const {
    return bps_ <= 0 ? Duration::zero() : Seconds(static_cast<double>(n) / bps_);
  }
  friend constexpr auto operator<=>(Bandwidth, Bandwidth) = default;

 private:
  explicit constexpr Bandwidth(double b) : bps_(b) {}
  double bps_ = 0;
};

}  // namespace ghost

#endif  // GHOST_COMMON_BASE_UNITS_H_
