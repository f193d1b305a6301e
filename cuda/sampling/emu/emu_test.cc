// Runs the sampling kernel (the copy gen.py makes) under the SIMT emulator (cuda/topk/emu/emu.h)
// on many small cases and compares tokens and logprobs, exactly, with a sequential reference of
// the documented integer semantics (cuda/sampling/README.md) written here from scratch: weights
// w = exp2f(((l - max) / T) * log2 e) (the emulated fast_exp2 is exp2f too), masses rint(w 2^31),
// top-k by key with ties kept, top-p threshold = the largest key whose mass from the top reaches
// ceil(p S), min-p on w, the Philox draw over the kept masses in index order.
#include "emu.h"
// (the emulator's macros first)
#include "cuda/sampling/sample.cuh"

#include <cmath>
#include <string>

using namespace fray::sampling_detail;

namespace {

// Element conversions (test data): fp32 as is, bf16 by rounding to nearest even.
template <class T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr const char* name = "f32";
  static float round(float v) { return v; }
  static float store(float v) { return v; }
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr const char* name = "bf16";
  static float round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
  static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

struct Params {
  float temp, top_p, min_p;
  int64_t top_k, seed, offset;
};

// Order key of the documented value order: NaN above +inf, -0 == +0.
uint32_t ref_key(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if (x == 0.0f) b = 0u;
  if (x != x) b = 0x7fc00000u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

uint32_t ref_fixed(float w) {  // rint(w * 2^31), NaN and negatives 0
  const float v = w * 2147483648.0f;
  if (!(v > 0.0f)) return 0u;
  if (v >= 4294967296.0f) return 0xffffffffu;
  return static_cast<uint32_t>(std::nearbyint(static_cast<double>(v)));
}

struct Out {
  int64_t token;
  float logprob;
};

Out reference(const std::vector<float>& x, const Params& p) {
  const int n = static_cast<int>(x.size());
  int greedy = 0;
  for (int i = 1; i < n; ++i) {
    if (ref_key(x[i]) > ref_key(x[greedy])) greedy = i;
  }
  if (p.temp == 0.0f) return {greedy, 0.0f};
  const uint32_t kmax = ref_key(x[greedy]);
  float lmax;
  {
    const uint32_t b = (kmax & 0x80000000u) ? (kmax & 0x7fffffffu) : ~kmax;
    std::memcpy(&lmax, &b, 4);
  }
  const float inv_t = 1.0f / p.temp;
  std::vector<float> w(n);
  std::vector<uint32_t> m(n);
  std::vector<char> keep(n, 1);
  for (int i = 0; i < n; ++i) {
    w[i] = exp2f(((x[i] - lmax) * inv_t) * 1.4426950408889634f);
    m[i] = ref_fixed(w[i]);
  }
  if (p.top_k > 0 && p.top_k < n) {
    std::vector<uint32_t> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = ref_key(x[i]);
    std::sort(keys.begin(), keys.end(), std::greater<uint32_t>());
    const uint32_t thr = keys[p.top_k - 1];
    for (int i = 0; i < n; ++i) keep[i] = ref_key(x[i]) >= thr;
  }
  if (p.top_p < 1.0f) {
    uint64_t S = 0;
    for (int i = 0; i < n; ++i) S += keep[i] ? m[i] : 0u;
    if (S > 0) {
      const double t = std::ceil(static_cast<double>(p.top_p) * static_cast<double>(S));
      const uint64_t tgt = t < 1.0 ? 1ull : static_cast<uint64_t>(t);
      std::vector<int> idx;
      for (int i = 0; i < n; ++i) {
        if (keep[i]) idx.push_back(i);
      }
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return ref_key(x[a]) > ref_key(x[b]); });
      uint64_t acc = 0;
      uint32_t thr = 0;
      for (size_t j = 0; j < idx.size();) {  // whole groups of equal keys
        const uint32_t k = ref_key(x[idx[j]]);
        size_t e = j;
        while (e < idx.size() && ref_key(x[idx[e]]) == k) acc += m[idx[e++]];
        if (acc >= tgt) {
          thr = k;
          break;
        }
        j = e;
      }
      for (int i = 0; i < n; ++i) keep[i] = keep[i] && ref_key(x[i]) >= thr;
    }
  }
  uint64_t total = 0;
  std::vector<uint32_t> km(n);
  for (int i = 0; i < n; ++i) {
    km[i] = keep[i] && w[i] >= p.min_p ? m[i] : 0u;
    total += km[i];
  }
  if (total == 0) return {greedy, 0.0f};
  const uint64_t draw = fray::sampling_detail::philox_draw24(static_cast<uint64_t>(p.seed), static_cast<uint64_t>(p.offset));
  const uint64_t target = (static_cast<uint64_t>((static_cast<unsigned __int128>(total) * draw) >> 64) << 40) |
                          ((total * draw) >> 24);
  uint64_t c = 0;
  for (int i = 0; i < n; ++i) {
    c += km[i];
    if (c > target) {
      const double z = static_cast<double>((x[i] - lmax) * inv_t);
      return {i, static_cast<float>(z - std::log(static_cast<double>(total) / 2147483648.0))};
    }
  }
  return {-1, 0.0f};  // unreachable
}

// Rows: 0 normals x 3, 1 flat (x 0.1), 2 all equal, 3 -inf masked but a few, 4 ties at the top
// (k + 30 equal maxima), 5 rounded normals (many ties), 6 a NaN maximum, 7 normals with a wide
// spread (x 30).
std::vector<float> make_row(int n, int pattern, std::mt19937_64& g, float (*round)(float)) {
  std::normal_distribution<double> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(nd(g) * 3.0);
  switch (pattern) {
    case 1:
      for (auto& v : x) v *= 0.0333f;
      break;
    case 2:
      for (auto& v : x) v = 0.75f;
      break;
    case 3:
      for (auto& v : x) v = -INFINITY;
      for (int j = 0; j < 9; ++j) x[g() % n] = static_cast<float>(nd(g));
      break;
    case 4:
      for (int j = 0; j < std::min(n, 80); ++j) x[g() % n] = 20.0f;
      break;
    case 5:
      for (auto& v : x) v = std::round(v);
      break;
    case 6:
      x[g() % n] = NAN;
      break;
    case 7:
      for (auto& v : x) v *= 10.0f;
      break;
    default:
      break;
  }
  for (auto& v : x) v = round(v);
  return x;
}

struct Case {
  int rows, cols, cluster, pattern;
  bool aligned;
};

int failures = 0;

template <class T>
void run_case(const Case& c, uint64_t seed) {
  using E = Elem<T>;
  std::mt19937_64 g(seed);
  emu::S().rng.seed(seed * 7 + 3);
  constexpr int vec = 16 / static_cast<int>(sizeof(T));
  const int64_t slice = slice_elems(c.cols, c.cluster, vec);
  if ((c.cluster - 1) * slice >= c.cols) return;  // a block without elements: not a plan the launcher makes
  const int off = c.aligned ? 0 : 1;
  const int64_t stride = ((c.cols + vec - 1) / vec) * vec + (c.aligned ? vec : 1);
  std::vector<T> buf(static_cast<size_t>(stride * c.rows) + 64);
  T* base = buf.data();
  while (reinterpret_cast<uintptr_t>(base) % 16 != 0) ++base;
  T* x = base + off;
  std::vector<std::vector<float>> rows;
  // Parameters per row, cycling through the paths: greedy, top-p alone, top-k with few survivors
  // (block 0 finishes), top-k beyond 1024 (cluster path), top-k + top-p + min-p, top-k = 1.
  const Params table[] = {
      {0.0f, 1.0f, 0.0f, 0, 0, 0},       {0.8f, 0.9f, 0.0f, 0, 0, 0},     {1.0f, 0.3f, 0.0f, 0, 0, 0},
      {0.7f, 0.9f, 0.0f, 50, 0, 0},      {1.3f, 1.0f, 0.0f, 1500, 0, 0},  {0.9f, 0.95f, 0.05f, 100, 0, 0},
      {1.0f, 0.5f, 0.0f, 1, 0, 0},       {2.0f, 0.99f, 0.2f, 0, 0, 0},    {0.5f, 1.0f, 0.0f, 7, 0, 0},
  };
  constexpr int kTable = sizeof(table) / sizeof(table[0]);
  std::vector<float> temp(c.rows), top_p(c.rows), min_p(c.rows);
  std::vector<int64_t> top_k(c.rows), seeds(c.rows), offs(c.rows);
  for (int r = 0; r < c.rows; ++r) {
    rows.push_back(make_row(c.cols, c.pattern, g, E::round));
    for (int i = 0; i < c.cols; ++i) x[r * stride + i] = E::store(rows[r][i]);
    const Params& p = table[(seed + r) % kTable];
    temp[r] = p.temp;
    top_p[r] = p.top_p;
    min_p[r] = p.min_p;
    top_k[r] = p.top_k;
    seeds[r] = static_cast<int64_t>(g());
    offs[r] = static_cast<int64_t>(g() >> 20);
  }
  std::vector<int64_t> tokens(c.rows + 4, -7);
  std::vector<float> logprobs(c.rows + 4, -7.0f);

  SampleArgs a{};
  a.logits = x;
  a.stride = stride;
  a.cols = c.cols;
  a.temperature = temp.data();
  a.top_k = top_k.data();
  a.top_p = top_p.data();
  a.min_p = min_p.data();
  a.seeds = seeds.data();
  a.offsets = offs.data();
  a.tokens = tokens.data();
  a.logprobs = logprobs.data();
  a.row0 = 0;
  a.slice = static_cast<int>(slice);
  a.vec_ok = c.aligned ? 1 : 0;
  const size_t smem = static_cast<size_t>(slice) * sizeof(T) + kAuxBytes;
  for (int r = 0; r < c.rows; ++r) {
    emu::run_cluster([a] { sample_kernel<T>(a); }, r * c.cluster, c.cluster, kThreads, smem);
  }

  char what[200];
  std::snprintf(what, sizeof what, "%s rows %d cols %d C %d pattern %d aligned %d seed %llu", E::name, c.rows,
                c.cols, c.cluster, c.pattern, c.aligned, static_cast<unsigned long long>(seed));
  bool ok = tokens[c.rows] == -7 && logprobs[c.rows] == -7.0f;
  if (!ok) std::printf("FAIL %s: write past the outputs\n", what);
  for (int r = 0; r < c.rows && ok; ++r) {
    const Params p{temp[r], top_p[r], min_p[r], top_k[r], seeds[r], offs[r]};
    const Out e = reference(rows[r], p);
    if (tokens[r] != e.token || std::memcmp(&logprobs[r], &e.logprob, 4) != 0) {
      std::printf("FAIL %s: row %d (T %g k %lld p %g min_p %g): token %lld logprob %.9g, expected %lld %.9g\n", what, r,
                  p.temp, static_cast<long long>(p.top_k), p.top_p, p.min_p, static_cast<long long>(tokens[r]),
                  logprobs[r], static_cast<long long>(e.token), e.logprob);
      ok = false;
    }
  }
  if (!ok) ++failures;
  std::printf("%s %s (switches %llu)\n", ok ? "ok  " : "FAIL", what, static_cast<unsigned long long>(emu::S().switches));
  std::fflush(stdout);
  emu::S().switches = 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int which = argc > 1 ? std::atoi(argv[1]) : -1;
  std::vector<Case> cases;
  // rows, cols, C, pattern, aligned
  for (int pattern = 0; pattern < 8; ++pattern) cases.push_back({9, 3000, 2, pattern, true});
  cases.push_back({9, 5000, 4, 0, true});
  cases.push_back({9, 5000, 4, 1, true});
  cases.push_back({9, 5000, 4, 4, true});
  cases.push_back({9, 4097, 1, 0, true});
  cases.push_back({9, 4097, 1, 5, true});
  cases.push_back({9, 3001, 2, 0, false});  // unaligned rows: the element-load path
  cases.push_back({9, 3001, 4, 3, false});
  cases.push_back({3, 37, 1, 0, true});
  cases.push_back({3, 1, 1, 0, true});
  cases.push_back({9, 9000, 8, 0, true});
  cases.push_back({9, 9000, 8, 2, true});
  // Many top-p candidates spread over every block (the gathered refinement's inputs).
  cases.push_back({27, 12000, 8, 1, true});
  cases.push_back({27, 12000, 4, 5, true});
  cases.push_back({27, 8000, 8, 7, true});
  // Narrow rows on a cluster of one block (no peer for a pushed exchange): the widths of the
  // sanitizer's first report (1000) and the one-block edges.
  cases.push_back({3, 7, 1, 2, true});
  cases.push_back({3, 1000, 1, 0, true});
  cases.push_back({3, 1000, 1, 1, false});
  cases.push_back({3, 2047, 1, 5, true});
  int n = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (which >= 0 && static_cast<int>(i) != which) continue;
    run_case<float>(cases[i], 1 + i);
    run_case<__nv_bfloat16>(cases[i], 101 + i);
    ++n;
  }
  std::printf("%d failures\n", failures);
  return failures != 0;
}
