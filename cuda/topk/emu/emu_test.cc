// Runs the topk stream kernel (the copy gen.py makes) under the SIMT emulator on many
// small cases and compares with an independent reference (value comparisons, no order keys).
#include "emu.h"
// (the emulator's macros first)
#include "cuda/topk/topk_stream.cuh"

#include <cmath>
#include <string>

using namespace fray::topk_detail;

namespace {

template <class T>
struct Elem;
template <>
struct Elem<float> {
  using Bits = uint32_t;
  static constexpr const char* name = "f32";
  static double value(Bits b, bool* nan) {
    float f;
    std::memcpy(&f, &b, 4);
    *nan = std::isnan(f);
    return f;
  }
  static Bits from(double v) {
    float f = static_cast<float>(v);
    Bits b;
    std::memcpy(&b, &f, 4);
    return b;
  }
  static Bits nan_bits(uint64_t r) { return 0x7f800000u | (static_cast<Bits>(r) & 0x807fffffu) | 1u; }
};
template <>
struct Elem<__nv_bfloat16> {
  using Bits = uint16_t;
  static constexpr const char* name = "bf16";
  static double value(Bits b, bool* nan) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    *nan = std::isnan(f);
    return f;
  }
  static Bits from(double v) {
    const float f = static_cast<float>(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<Bits>(u >> 16);  // truncation: fine for test data
  }
  static Bits nan_bits(uint64_t r) { return static_cast<Bits>(0x7f80u | (r & 0x807fu) | 1u); }
};
template <>
struct Elem<__half> {
  using Bits = uint16_t;
  static constexpr const char* name = "f16";
  static double value(Bits b, bool* nan) {
    const int s = b >> 15, e = (b >> 10) & 31, m = b & 1023;
    *nan = e == 31 && m != 0;
    double v;
    if (e == 0) {
      v = std::ldexp(m, -24);
    } else if (e == 31) {
      v = m ? NAN : INFINITY;
    } else {
      v = std::ldexp(1024 + m, e - 25);
    }
    return s ? -v : v;
  }
  static Bits from(double v) {
    // small integers and +-inf / +-0 only (test data): exact
    if (std::isinf(v)) return v > 0 ? 0x7c00 : 0xfc00;
    if (v == 0) return std::signbit(v) ? 0x8000 : 0;
    const int s = v < 0;
    double a = std::fabs(v);
    int e;
    const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
    int ex = e - 1 + 15;
    if (ex >= 31) return s ? 0xfc00 : 0x7c00;
    if (ex <= 0) {
      const int m = static_cast<int>(a / std::ldexp(1.0, -24));
      return static_cast<Bits>((s << 15) | m);
    }
    const int m = static_cast<int>((f * 2 - 1) * 1024);
    return static_cast<Bits>((s << 15) | (ex << 10) | m);
  }
  static Bits nan_bits(uint64_t r) { return static_cast<Bits>(0x7c00u | (r & 0x83ffu) | 1u); }
};

struct Case {
  int rows, width, k, cluster;
  bool sorted, largest, rank_keys, aligned, stride0;
  int pattern;
};

template <class T>
std::vector<typename Elem<T>::Bits> make_row(int width, int pattern, std::mt19937_64& g) {
  using E = Elem<T>;
  std::vector<typename E::Bits> x(width);
  std::normal_distribution<double> nd;
  const double inf = INFINITY;
  switch (pattern) {
    case 0:  // rounded normals (ties) with NaN / +-inf / +-0 sprinkled
      for (auto& v : x) v = E::from(std::round(nd(g) * 4));
      for (int j = 0; j < std::max(1, width / 64); ++j) {
        x[g() % width] = E::nan_bits(g());
        x[g() % width] = E::from(inf);
        x[g() % width] = E::from(-inf);
        x[g() % width] = E::from(-0.0);
        x[g() % width] = E::from(0.0);
      }
      break;
    case 1:  // all equal
      for (auto& v : x) v = E::from(2.5);
      break;
    case 2:  // mostly -inf, a few finite values
      for (auto& v : x) v = E::from(-inf);
      for (int j = 0; j < 37; ++j) x[g() % width] = E::from(std::round(nd(g) * 8));
      break;
    case 3:  // many NaNs (sign and payload vary), the rest rounded normals
      for (auto& v : x) v = (g() % 3 != 0) ? E::nan_bits(g()) : E::from(std::round(nd(g) * 4));
      break;
    case 4:  // +0 / -0 only, a few 1.0
      for (auto& v : x) v = E::from((g() & 1) ? -0.0 : 0.0);
      for (int j = 0; j < 5; ++j) x[g() % width] = E::from(1.0);
      break;
    case 5:  // continuous normals (few ties in fp32)
      for (auto& v : x) v = E::from(nd(g));
      break;
    case 6:  // random bits: NaN payloads, denormals, everything
      for (auto& v : x) v = static_cast<typename E::Bits>(g());
      break;
    case 7:  // constant blocks of 1000
      for (int i = 0; i < width; ++i) x[i] = E::from(static_cast<double>((i / 1000) % 7) - 3.0);
      break;
    case 8:  // ascending
      for (int i = 0; i < width; ++i) x[i] = E::from(static_cast<double>(i % 2000));
      break;
    case 9:  // all NaN
      for (auto& v : x) v = E::nan_bits(g());
      break;
    case 11:  // round(normal * 50): moderate ties everywhere
      for (auto& v : x) v = E::from(std::round(nd(g) * 50));
      break;
    case 12:  // a block of 6000 equal maxima at the start (one CTA's entries overflow)
      for (int i = 0; i < width; ++i) x[i] = E::from(i < 6000 ? 10.0 : std::round(nd(g) * 2));
      break;
    case 13:  // the 4096 largest values all in the first 4096 elements, distinct
      for (int i = 0; i < width; ++i) x[i] = E::from(i < 4096 ? 100.0 + (i % 97) : nd(g));
      break;
    case 10:  // one huge tie block at the k-th value: half the row 1.0, rest smaller, few larger
      for (auto& v : x) v = E::from((g() & 1) ? 1.0 : -1.0);
      for (int j = 0; j < 20; ++j) x[g() % width] = E::from(2.0);
      break;
    default:
      emu::fail("pattern");
  }
  return x;
}

// Reference: indices of the top k in rank order (NaN above all, -0 == +0, ties by lower index;
// largest=false reverses the value order, NaN last).
template <class T>
std::vector<int> reference(const std::vector<typename Elem<T>::Bits>& x, int k, bool largest) {
  const int n = static_cast<int>(x.size());
  std::vector<double> v(n);
  std::vector<char> isnan(n);
  for (int i = 0; i < n; ++i) {
    bool nn;
    v[i] = Elem<T>::value(x[i], &nn);
    isnan[i] = nn;
  }
  std::vector<int> idx(n);
  for (int i = 0; i < n; ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    if (isnan[a] || isnan[b]) {
      if (isnan[a] && isnan[b]) return false;
      return largest ? isnan[a] != 0 : isnan[b] != 0;
    }
    return largest ? v[a] > v[b] : v[a] < v[b];  // -0 == +0: neither before
  });
  idx.resize(k);
  return idx;
}

template <class T, int VEC, bool CL>
void launch(const TopkArgs& a, int rows, int cluster, size_t smem) {
  for (int r = 0; r < rows; ++r) {
    emu::run_cluster([a] { topk_stream_kernel<T, VEC, CL>(a); }, r * cluster, cluster, kStreamThreads, smem);
  }
}

int failures = 0;
int g_prefilter = -1;  // -1: the launcher's rule (stream_prefilter); 0 / 1 forced

template <class T>
void run_case(const Case& c, uint64_t seed, const std::vector<typename Elem<T>::Bits>* given = nullptr) {
  using E = Elem<T>;
  using Bits = typename E::Bits;
  std::mt19937_64 g(seed);
  emu::S().rng.seed(seed * 7 + 1);
  const int vec = 16 / static_cast<int>(sizeof(Bits));
  // row stride: width rounded up to 16 bytes (+ pad), or 0
  const int64_t stride = c.stride0 ? 0 : ((c.width + vec - 1) / vec) * vec + vec;
  const int off = c.aligned ? 0 : 1;
  std::vector<Bits> buf(static_cast<size_t>(c.stride0 ? c.width : stride * c.rows) + 64);
  Bits* base = buf.data();
  while (reinterpret_cast<uintptr_t>(base) % 16 != 0) ++base;
  Bits* x = base + off;
  std::vector<std::vector<Bits>> rowsdata;
  for (int r = 0; r < (c.stride0 ? 1 : c.rows); ++r) {
    std::vector<Bits> row;
    if (given != nullptr) {
      const auto first = given->begin() + static_cast<size_t>(r) * c.width;
      row.assign(first, first + c.width);
    } else {
      row = make_row<T>(c.width, c.pattern, g);
      if (c.pattern == 0 && c.rows >= 3 && r < 3) row = make_row<T>(c.width, r == 0 ? 0 : r == 1 ? 9 : 1, g);
    }
    std::memcpy(x + r * stride, row.data(), c.width * sizeof(Bits));
    rowsdata.push_back(row);
  }
  const int k = c.k;
  const int guard = 17;
  std::vector<Bits> vals(static_cast<size_t>(c.rows) * k + guard, static_cast<Bits>(0x5a5a));
  std::vector<int64_t> inds(static_cast<size_t>(c.rows) * k + guard, -7);
  std::vector<int64_t> rks(static_cast<size_t>(c.rows) * k + guard, -9);

  TopkArgs a{};
  a.x = x;
  a.x_stride = stride;
  a.values = vals.data();
  a.indices = inds.data();
  a.rank_keys = c.rank_keys ? rks.data() : nullptr;
  a.rows = c.rows;
  a.width = c.width;
  a.k = k;
  a.slice = static_cast<int>(ceil_div(ceil_div(c.width, c.cluster), kSliceAlign) * kSliceAlign);
  a.sort_size = c.sorted ? static_cast<int>(next_pow2(k)) : 0;
  a.flip = c.largest ? 0u : OrderKey<T>::kAll;
  a.prefilter = g_prefilter >= 0 ? g_prefilter : stream_prefilter(c.width, k, c.aligned) ? 1 : 0;
  const size_t smem = stream_smem(c.cluster);
  const bool vec_ok = c.aligned;  // stride is a multiple of 16 bytes
  if (vec_ok) {
    if (c.cluster > 1) launch<T, 16 / sizeof(Bits), true>(a, c.rows, c.cluster, smem);
    else launch<T, 16 / sizeof(Bits), false>(a, c.rows, c.cluster, smem);
  } else {
    if (c.cluster > 1) launch<T, 1, true>(a, c.rows, c.cluster, smem);
    else launch<T, 1, false>(a, c.rows, c.cluster, smem);
  }

  char what[256];
  std::snprintf(what, sizeof what,
                "%s rows %d width %d k %d C %d sorted %d largest %d rank_keys %d aligned %d stride0 %d pattern %d "
                "prefilter %d seed %llu",
                E::name, c.rows, c.width, k, c.cluster, c.sorted, c.largest, c.rank_keys, c.aligned, c.stride0,
                c.pattern, a.prefilter, static_cast<unsigned long long>(seed));
  bool ok = true;
  for (int i = 0; i < guard; ++i) {
    const size_t at = static_cast<size_t>(c.rows) * k + i;
    if (vals[at] != static_cast<Bits>(0x5a5a) || inds[at] != -7 || rks[at] != -9) {
      ok = false;
      std::printf("FAIL %s: write past the outputs\n", what);
    }
  }
  for (int r = 0; r < c.rows && ok; ++r) {
    const auto& row = rowsdata[c.stride0 ? 0 : r];
    const std::vector<int> exp = reference<T>(row, k, c.largest);
    std::vector<int> exp_sorted = exp;
    std::sort(exp_sorted.begin(), exp_sorted.end());
    if (c.rank_keys) {
      std::vector<std::pair<int64_t, int>> got;
      for (int j = 0; j < k; ++j) {
        const int64_t rk = rks[static_cast<size_t>(r) * k + j];
        const int idx = static_cast<int>(kRankKeyIndexMask - (rk & kRankKeyIndexMask));
        if (rk < 0 || idx != exp_sorted[j]) {
          std::printf("FAIL %s: row %d rank key %d: %lld (index %d, expected %d)\n", what, r, j,
                      static_cast<long long>(rk), idx, exp_sorted[j]);
          ok = false;
          break;
        }
        got.push_back({rk, idx});
      }
      if (!ok) break;
      std::sort(got.begin(), got.end(), [](auto& p, auto& q) { return p.first > q.first; });
      for (int j = 0; j < k; ++j) {
        if (got[j].second != exp[j]) {
          std::printf("FAIL %s: row %d rank keys do not rank: position %d index %d expected %d\n", what, r, j,
                      got[j].second, exp[j]);
          ok = false;
          break;
        }
      }
      continue;
    }
    for (int j = 0; j < k; ++j) {
      const int64_t gi = inds[static_cast<size_t>(r) * k + j];
      const int ei = c.sorted ? exp[j] : exp_sorted[j];
      if (gi != ei) {
        std::printf("FAIL %s: row %d position %d: index %lld expected %d\n", what, r, j,
                    static_cast<long long>(gi), ei);
        ok = false;
        break;
      }
      if (vals[static_cast<size_t>(r) * k + j] != row[ei]) {
        std::printf("FAIL %s: row %d position %d: value bits differ\n", what, r, j);
        ok = false;
        break;
      }
    }
  }
  if (!ok) ++failures;
  std::printf("%s %s (switches %llu)\n", ok ? "ok  " : "FAIL", what,
              static_cast<unsigned long long>(emu::S().switches));
  std::fflush(stdout);
  emu::S().switches = 0;
}

}  // namespace

template <class T>
int run_file(int argc, char** argv) {
  // emu_test file PATH DTYPE ROWS WIDTH C K... : rows of raw element bits from PATH
  const int rows = std::atoi(argv[4]), width = std::atoi(argv[5]), cl = std::atoi(argv[6]);
  std::vector<typename Elem<T>::Bits> data(static_cast<size_t>(rows) * width);
  FILE* f = std::fopen(argv[2], "rb");
  if (!f || std::fread(data.data(), sizeof(data[0]), data.size(), f) != data.size()) emu::fail("read");
  std::fclose(f);
  for (int a = 7; a < argc; ++a) {
    const int k = std::atoi(argv[a]);
    for (int m = 0; m < 4; ++m) {
      Case c{rows, width, k, cl, (m & 1) != 0, (m & 2) != 0, false, true, false, -1};
      run_case<T>(c, 1000 + a * 4 + m, &data);
    }
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "file") {
    const std::string dt = argv[3];
    if (dt == "f32") return run_file<float>(argc, argv);
    if (dt == "bf16") return run_file<__nv_bfloat16>(argc, argv);
    return run_file<__half>(argc, argv);
  }
  const int which = argc > 1 ? std::atoi(argv[1]) : -1;
  const uint64_t seed0 = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  std::vector<Case> cases;
  // rows, width, k, C, sorted, largest, rank_keys, aligned, stride0, pattern
  cases.push_back({3, 20000, 50, 4, true, true, false, true, false, 0});
  cases.push_back({3, 20000, 50, 4, false, true, false, true, false, 0});
  cases.push_back({2, 20000, 50, 4, true, false, false, true, false, 5});
  cases.push_back({2, 20011, 1, 2, true, true, false, false, false, 5});
  cases.push_back({1, 20000, 4096, 4, true, true, false, true, false, 5});
  cases.push_back({1, 20000, 4096, 4, false, false, false, true, false, 0});
  cases.push_back({1, 20000, 1024, 8, true, true, false, true, false, 0});
  cases.push_back({1, 20000, 50, 2, true, true, false, true, false, 1});   // all equal: overflow
  cases.push_back({1, 20000, 50, 2, false, false, false, true, false, 1});
  cases.push_back({1, 20000, 4096, 2, true, true, false, true, false, 1});
  cases.push_back({1, 20000, 50, 2, true, true, false, true, false, 2});   // mostly -inf
  cases.push_back({1, 20000, 50, 2, true, false, false, true, false, 2});
  cases.push_back({1, 20000, 300, 4, true, true, false, true, false, 3});  // many NaNs
  cases.push_back({1, 20000, 300, 4, false, false, false, false, false, 3});
  cases.push_back({1, 20000, 7, 4, true, true, false, true, false, 4});    // +-0
  cases.push_back({1, 20000, 2000, 1, true, true, false, true, false, 4});
  cases.push_back({1, 20000, 100, 4, true, true, false, true, false, 6});  // random bits
  cases.push_back({1, 20000, 100, 4, true, false, false, true, false, 6});
  cases.push_back({1, 20000, 3000, 4, true, true, false, true, false, 7}); // constant blocks
  cases.push_back({1, 20000, 100, 4, true, true, false, true, false, 8});
  cases.push_back({1, 20000, 100, 4, true, true, false, true, false, 9});  // all NaN
  cases.push_back({1, 20000, 5000 > 4096 ? 4096 : 5000, 4, false, true, true, true, false, 10});
  cases.push_back({2, 20000, 60, 4, false, true, true, true, false, 0});   // rank keys
  cases.push_back({3, 20000, 50, 4, true, true, false, true, true, 0});    // row stride 0
  cases.push_back({1, 9000, 3, 16, true, true, false, true, false, 0});    // C 16
  cases.push_back({1, 40000, 1000, 1, true, false, false, true, false, 10});
  cases.push_back({2, 17, 5, 16, true, true, false, true, false, 5});     // empty CTAs
  cases.push_back({2, 17, 17, 16, false, false, false, false, false, 0});
  cases.push_back({1, 20000, 50, 4, true, true, false, true, false, 11});  // moderate ties at the k-th key
  cases.push_back({1, 20000, 50, 4, false, false, false, true, false, 11});
  cases.push_back({1, 20000, 50, 4, true, true, false, true, false, 12});   // surprise overflow
  cases.push_back({1, 20000, 4096, 4, false, true, false, true, false, 12});
  cases.push_back({1, 20000, 4096, 4, true, true, false, true, false, 13});  // all k winners in one CTA
  cases.push_back({1, 20000, 4096, 4, true, false, false, false, false, 13});
  cases.push_back({2, 4000, 50, 16, true, true, false, true, false, 1});    // index digit of 1 bit < C bins
  cases.push_back({2, 4000, 2100, 16, false, false, false, true, false, 1});
  // heavy (run by index): widths as on the GPU
  cases.push_back({1, 262144, 50, 16, true, true, false, true, false, 5});
  cases.push_back({1, 150000, 4096, 8, true, false, false, true, false, 5});
  cases.push_back({1, 131072, 50, 8, true, true, false, true, false, 2});
  cases.push_back({1, 131072, 1024, 8, false, true, false, true, false, 0});
  int n = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (which >= 0 && static_cast<int>(i) != which) continue;
    if (which < 0 && cases[i].width > 100000) continue;  // heavy: by index only
    // Cases the prefilter takes run twice: with it, then without (the one-pass-1 path).
    const bool pf = stream_prefilter(cases[i].width, cases[i].k, cases[i].aligned);
    for (int mode = pf ? -1 : 0; mode <= 0; ++mode) {
      g_prefilter = mode;
      run_case<float>(cases[i], seed0 + i);
      run_case<__nv_bfloat16>(cases[i], seed0 + 100 + i);
      if (i % 3 == 0) run_case<__half>(cases[i], seed0 + 200 + i);
    }
    ++n;
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}
