// The LSTM recurrence of rnntrain's CPU training path (rnntrain/compute/lstmscan.py).
//
// One call runs D directions (1 or 2) of one layer over a zero-padded batch of N sequences
// of unequal lengths, T frames at most; direction 1 runs each sequence backwards within
// its own length. The input projections (x W_ih^T + b_ih + b_hh, all frames and directions
// at once) and the weight gradients (one GEMM each) are torch's; this file does only what
// runs step by step, where oneDNN's kernel pays a fixed cost at every time step.
//
// Layouts (row-major, gate order i, f, g, o as torch's nn.LSTM):
//   xg   (T, N, D, 4H)  input projections plus biases
//   R    (D, 4H, H)     recurrent weights (weight_hh), packed per call for the products
//   out  (T, N, D, H)   h_t, zero at padding (= (T, N, D*H): torch's bidirectional output)
//   act  (T, N, D, 4H)  gate activations sigma(i), sigma(f), tanh(g), sigma(o)
//   cst  (T, N, D, H)   c_t                 tcs (T, N, D, H): tanh(c_t)
//   dg   (T, N, D, 4H)  d loss / d pre-activations (zero at padding) = d xg
//
// Each call is single-threaded and sums in a fixed order: the same inputs give the same
// bits, whatever else runs. The directions run one after the other, each over all its
// steps, so each one's packed weights stay in the core's L2 (H = 256: 1 MB a direction).
// The products are blocked over up to six sequences and four vectors of 64 bytes (GCC
// vector extensions: the compiler's widest ISA for the machine it is built on); sigmoid
// and tanh use a vectorised exp (float) or std::exp (double).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace {

template <class F> struct Vec;
template <> struct Vec<float> {
    typedef float v __attribute__((vector_size(64), aligned(4)));
    typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
    static constexpr int W = 16;
};
template <> struct Vec<double> {
    typedef double v __attribute__((vector_size(64), aligned(8)));
    typedef int64_t vi __attribute__((vector_size(64), aligned(8)));
    static constexpr int W = 8;
};

template <class F> inline typename Vec<F>::v load(const F* p) {
    return *reinterpret_cast<const typename Vec<F>::v*>(p);
}
template <class F> inline void store(F* p, typename Vec<F>::v x) {
    *reinterpret_cast<typename Vec<F>::v*>(p) = x;
}
// a scalar in every lane, spelled as an initializer so that GCC broadcasts straight from
// memory (a load-port uop), not through an add of +0.0 and a register shuffle
template <class F> inline typename Vec<F>::v splat(F a);
template <> inline Vec<float>::v splat<float>(float a) {
    return Vec<float>::v{a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a};
}
template <> inline Vec<double>::v splat<double>(double a) {
    return Vec<double>::v{a, a, a, a, a, a, a, a};
}

// exp for a vector of floats: Cephes' expf (range reduction by ln 2, degree-5 polynomial),
// about 1 ulp on [-87, 88]; inputs are clamped there (sigmoid and tanh saturate anyway).
inline Vec<float>::v vexp(Vec<float>::v x) {
    typedef Vec<float>::v V;
    typedef Vec<float>::vi VI;
    x = x < splat<float>(88.0f) ? x : splat<float>(88.0f);
    x = x > splat<float>(-87.0f) ? x : splat<float>(-87.0f);
    V fx = x * splat<float>(1.44269504088896341f) + splat<float>(0.5f);
    VI n = __builtin_convertvector(fx, VI);           // truncates toward zero
    V fn = __builtin_convertvector(n, V);
    n += (fn > fx);                                   // floor: -1 where truncation rounded up
    fn = __builtin_convertvector(n, V);
    x = x - fn * splat<float>(0.693359375f) + fn * splat<float>(2.12194440e-4f);
    V z = x * x;
    V y = splat<float>(1.9875691500e-4f);
    y = y * x + splat<float>(1.3981999507e-3f);
    y = y * x + splat<float>(8.3334519073e-3f);
    y = y * x + splat<float>(4.1665795894e-2f);
    y = y * x + splat<float>(1.6666665459e-1f);
    y = y * x + splat<float>(5.0000001201e-1f);
    y = y * z + x + splat<float>(1.0f);
    VI e = (n + 127) << 23;
    V scale;
    std::memcpy(&scale, &e, sizeof scale);
    return y * scale;
}

template <class F> inline F sigm(F x) { return F(1) / (F(1) + std::exp(-x)); }

// a[0:4H] pre-activations → activations in place (i, f, o: sigmoid; g: tanh).
template <class F> void activate(F* a, int H) {
    for (int j = 0; j < 4 * H; ++j)
        a[j] = (j >= 2 * H && j < 3 * H) ? std::tanh(a[j]) : sigm(a[j]);
}
template <> void activate<float>(float* a, int H) {
    typedef Vec<float>::v V;
    constexpr int W = Vec<float>::W;
    const V one = splat<float>(1.0f), two = splat<float>(2.0f);
    for (int q = 0; q < 4; ++q) {
        float* p = a + q * H;
        int j = 0;
        if (q == 2) {
            for (; j + W <= H; j += W)   // tanh(x) = 2 / (1 + exp(-2x)) - 1
                store<float>(p + j, two / (one + vexp(-two * load<float>(p + j))) - one);
            for (; j < H; ++j) p[j] = std::tanh(p[j]);
        } else {
            for (; j + W <= H; j += W)
                store<float>(p + j, one / (one + vexp(-load<float>(p + j))));
            for (; j < H; ++j) p[j] = sigm(p[j]);
        }
    }
}

// tanh of c[0:H] into t.
template <class F> void tanh_row(const F* c, F* t, int H) {
    for (int j = 0; j < H; ++j) t[j] = std::tanh(c[j]);
}
template <> void tanh_row<float>(const float* c, float* t, int H) {
    typedef Vec<float>::v V;
    constexpr int W = Vec<float>::W;
    const V one = splat<float>(1.0f), two = splat<float>(2.0f);
    int j = 0;
    for (; j + W <= H; j += W)
        store<float>(t + j, two / (one + vexp(-two * load<float>(c + j))) - one);
    for (; j < H; ++j) t[j] = std::tanh(c[j]);
}

// Pack the weights for gemm_packed: block b of BW columns of B (K, M), B[k][m] = src(k, m),
// stored as P[b][k][0:BW] (zero beyond M), so each block streams through the cache in order.
template <class F, class Src>
void pack(F* P, int K, int M, Src src) {
    constexpr int BW = 4 * Vec<F>::W;
    for (int b = 0; b * BW < M; ++b)
        for (int k = 0; k < K; ++k)
            for (int j = 0; j < BW; ++j) {
                const int m = b * BW + j;
                P[((int64_t)b * K + k) * BW + j] = m < M ? src(k, m) : F(0);
            }
}

// C[r][m0:m0+NV*W] = X[r][...] + sum_k A[r][k] B[k][m0:m0+NV*W] for r < NB: NV vectors of
// one block p of the packed B (K x BW, rows BW apart; a few KB to tens of KB: it stays in
// cache while every row block passes). NV < 4: the last block of a width that is not a
// multiple of BW (the 96 cells of the FSDD recipe: a block and a half).
template <class F, int NB, int NV>
void gemm_block(F* const* C, const F* const* X, const F* const* A, const F* p, int K, int m0) {
    typedef typename Vec<F>::v V;
    constexpr int W = Vec<F>::W, BW = 4 * W;
    V acc[NB][NV];
    for (int r = 0; r < NB; ++r)
        for (int j = 0; j < NV; ++j) acc[r][j] = load<F>(X[r] + m0 + j * W);
    for (int k = 0; k < K; ++k, p += BW) {
        V bv[NV];
        for (int j = 0; j < NV; ++j) bv[j] = load<F>(p + j * W);
        for (int r = 0; r < NB; ++r) {
            const V a = splat<F>(A[r][k]);
            for (int j = 0; j < NV; ++j) acc[r][j] += a * bv[j];
        }
    }
    for (int r = 0; r < NB; ++r)
        for (int j = 0; j < NV; ++j) store<F>(C[r] + m0 + j * W, acc[r][j]);
}

// The same for NB rows by the block's width in whole vectors (nv of 1..4), then the
// columns past the last whole vector one by one (a width that is not a multiple of W).
template <class F, int NB>
void gemm_rows(F* const* C, const F* const* X, const F* const* A, const F* p, int K, int m0,
               int M) {
    constexpr int W = Vec<F>::W, BW = 4 * W;
    const int width = M - m0 < BW ? M - m0 : BW, nv = width / W;
    switch (nv) {
        case 4: gemm_block<F, NB, 4>(C, X, A, p, K, m0); break;
        case 3: gemm_block<F, NB, 3>(C, X, A, p, K, m0); break;
        case 2: gemm_block<F, NB, 2>(C, X, A, p, K, m0); break;
        case 1: gemm_block<F, NB, 1>(C, X, A, p, K, m0); break;
        default: break;
    }
    for (int r = 0; r < NB; ++r)
        for (int m = m0 + nv * W; m < m0 + width; ++m) {
            F s = X[r][m];
            for (int k = 0; k < K; ++k) s += A[r][k] * p[(int64_t)k * BW + m - m0];
            C[r][m] = s;
        }
}

// C[r][0:M] = X[r][0:M] + sum_k A[r][k] B[k][0:M] for r < rows (X may be C), B packed by
// pack(); column blocks outside, row blocks inside: each block of B leaves L2 once a call.
template <class F>
void gemm(F* const* C, const F* const* X, const F* const* A, const F* P, int rows, int K,
          int M) {
    constexpr int BW = 4 * Vec<F>::W;
    for (int b = 0; b * BW < M; ++b) {
        const F* p = P + (int64_t)b * K * BW;
        const int m0 = b * BW;
        int r = 0;
        for (; r + 6 <= rows; r += 6) gemm_rows<F, 6>(C + r, X + r, A + r, p, K, m0, M);
        switch (rows - r) {
            case 5: gemm_rows<F, 5>(C + r, X + r, A + r, p, K, m0, M); break;
            case 4: gemm_rows<F, 4>(C + r, X + r, A + r, p, K, m0, M); break;
            case 3: gemm_rows<F, 3>(C + r, X + r, A + r, p, K, m0, M); break;
            case 2: gemm_rows<F, 2>(C + r, X + r, A + r, p, K, m0, M); break;
            case 1: gemm_rows<F, 1>(C + r, X + r, A + r, p, K, m0, M); break;
            default: break;
        }
    }
}

inline int64_t packed_size(int K, int M, int BW) { return (int64_t)K * ((M + BW - 1) / BW) * BW; }

// c = f*cp + i*g, tc = tanh(c), h = o*tc over H cells (a: the four activations).
template <class F>
void cell_forward(const F* __restrict__ a, const F* __restrict__ cp, F* __restrict__ c,
                  F* __restrict__ tc, F* __restrict__ h, int H) {
    for (int j = 0; j < H; ++j) c[j] = a[H + j] * cp[j] + a[j] * a[2 * H + j];
    tanh_row<F>(c, tc, H);
    for (int j = 0; j < H; ++j) h[j] = a[3 * H + j] * tc[j];
}

// One cell's backward step: dh (from above and the step after) and dc (the step after)
// → the four pre-activation gradients g; dc becomes the step before's.
template <class F>
void cell_backward(const F* __restrict__ a, const F* __restrict__ tc, const F* __restrict__ cp,
                   const F* __restrict__ go, const F* __restrict__ dhn, F* __restrict__ dcn,
                   F* __restrict__ g, int H) {
    for (int j = 0; j < H; ++j) {
        const F i = a[j], f = a[H + j], z = a[2 * H + j], o = a[3 * H + j];
        const F h = go[j] + dhn[j];
        const F th = tc[j];
        const F dcj = dcn[j] + h * o * (F(1) - th * th);
        g[3 * H + j] = h * th * o * (F(1) - o);
        g[j] = dcj * z * i * (F(1) - i);
        g[2 * H + j] = dcj * i * (F(1) - z * z);
        g[H + j] = dcj * cp[j] * f * (F(1) - f);
        dcn[j] = dcj * f;
    }
}

template <class F>
int forward(int T, int N, int D, int H, const int64_t* len, const F* xg, const F* R,
            F* out, F* act, F* cst, F* tcs) {
    const int64_t G = 4 * H, rowg = (int64_t)D * G, rowh = (int64_t)D * H;
    constexpr int BW = 4 * Vec<F>::W;
    const int64_t psz = packed_size(H, (int)G, BW);
    std::unique_ptr<F[]> P(new F[D * psz]);   // every element written by pack: no zeroing
    std::vector<F> zeros(H, F(0));
    for (int d = 0; d < D; ++d)   // B[k][m] = R[d][m][k]: (H, G)
        pack<F>(P.get() + d * psz, H, (int)G,
                [&](int k, int m) { return R[((int64_t)d * G + m) * H + k]; });
    std::vector<int> active;
    std::vector<const F*> A, X;
    std::vector<F*> C;
    for (int s = 0; s < T; ++s)
        for (int n = 0; n < N; ++n)
            if (len[n] <= s)  // padding at time s: zero output (act, cst, tcs never read there)
                std::memset(out + ((int64_t)s * N + n) * rowh, 0, rowh * sizeof(F));
    // one direction after the other (their arithmetic is independent): each direction's
    // packed weights stay in L2 for all its steps (H = 256: 1 MB a direction, 2 MB both)
    for (int d = 0; d < D; ++d) {
        for (int s = 0; s < T; ++s) {
            active.clear();
            for (int n = 0; n < N; ++n) if (len[n] > s) active.push_back(n);
            if (active.empty()) break;
            A.clear(); C.clear(); X.clear();
            for (int n : active) {
                const int64_t t = d == 0 ? s : len[n] - 1 - s;
                const int64_t tp = d == 0 ? t - 1 : t + 1;   // the step before, in time
                F* a = act + (t * N + n) * rowg + d * G;
                const F* x = xg + (t * N + n) * rowg + d * G;
                if (s == 0) std::memcpy(a, x, G * sizeof(F));   // h_{-1} = 0: no product
                else A.push_back(out + (tp * N + n) * rowh + d * H);
                X.push_back(x);
                C.push_back(a);
            }
            if (s > 0) gemm<F>(C.data(), X.data(), A.data(), P.get() + d * psz, (int)C.size(), H,
                               (int)G);
            for (size_t r = 0; r < active.size(); ++r) {
                const int n = active[r];
                const int64_t t = d == 0 ? s : len[n] - 1 - s;
                const int64_t tp = d == 0 ? t - 1 : t + 1;
                activate<F>(C[r], H);
                const int64_t o = (t * N + n) * rowh + d * H;
                cell_forward<F>(C[r], s == 0 ? zeros.data() : cst + (tp * N + n) * rowh + d * H,
                                cst + o, tcs + o, out + o, H);
            }
        }
    }
    return 0;
}

template <class F>
int backward(int T, int N, int D, int H, const int64_t* len, const F* R, const F* dout,
             const F* act, const F* cst, const F* tcs, F* dg) {
    const int64_t G = 4 * H, rowg = (int64_t)D * G, rowh = (int64_t)D * H;
    constexpr int BW = 4 * Vec<F>::W;
    const int64_t psz = packed_size((int)G, H, BW);
    std::unique_ptr<F[]> P(new F[D * psz]);
    std::vector<F> zeros(H, F(0));
    for (int d = 0; d < D; ++d)   // B[k][m] = R[d][k][m]: (G, H)
        pack<F>(P.get() + d * psz, (int)G, H,
                [&](int k, int m) { return R[((int64_t)d * G + k) * H + m]; });
    // carried from the step after (in scan order): dh (through R) and dc, per direction
    std::vector<F> dh((int64_t)D * N * H, F(0)), dc((int64_t)D * N * H, F(0));
    std::vector<int> active;
    std::vector<const F*> A;
    std::vector<F*> C;
    int64_t maxlen = 0;
    for (int n = 0; n < N; ++n) maxlen = len[n] > maxlen ? len[n] : maxlen;
    for (int64_t t = maxlen; t < T; ++t)
        std::memset(dg + t * N * rowg, 0, N * rowg * sizeof(F));
    for (int64_t s = 0; s < maxlen; ++s)
        for (int n = 0; n < N; ++n)
            if (len[n] <= s) std::memset(dg + (s * N + n) * rowg, 0, rowg * sizeof(F));
    for (int d = 0; d < D; ++d) {   // one direction after the other, as forward
        for (int64_t s = maxlen - 1; s >= 0; --s) {
            active.clear();
            for (int n = 0; n < N; ++n) if (len[n] > s) active.push_back(n);
            A.clear(); C.clear();
            for (int n : active) {
                const int64_t t = d == 0 ? s : len[n] - 1 - s;
                const int64_t tp = d == 0 ? t - 1 : t + 1;
                const int64_t o = (t * N + n) * rowh + d * H;
                F* dhn = dh.data() + ((int64_t)d * N + n) * H;
                F* g = dg + (t * N + n) * rowg + d * G;
                cell_backward<F>(act + (t * N + n) * rowg + d * G, tcs + o,
                                 s == 0 ? zeros.data() : cst + (tp * N + n) * rowh + d * H,
                                 dout + o, dhn, dc.data() + ((int64_t)d * N + n) * H, g, H);
                std::memset(dhn, 0, H * sizeof(F));
                A.push_back(g);
                C.push_back(dhn);
            }
            if (s > 0) gemm<F>(C.data(), C.data(), A.data(), P.get() + d * psz, (int)C.size(),
                               (int)G, H);
        }
    }
    return 0;
}

}  // namespace

extern "C" {
int rnntrain_lstm_forward_f32(int T, int N, int D, int H, const int64_t* len, const float* xg,
                              const float* R, float* out, float* act, float* cst, float* tcs) {
    return forward<float>(T, N, D, H, len, xg, R, out, act, cst, tcs);
}
int rnntrain_lstm_forward_f64(int T, int N, int D, int H, const int64_t* len, const double* xg,
                              const double* R, double* out, double* act, double* cst,
                              double* tcs) {
    return forward<double>(T, N, D, H, len, xg, R, out, act, cst, tcs);
}
int rnntrain_lstm_backward_f32(int T, int N, int D, int H, const int64_t* len, const float* R,
                               const float* dout, const float* act, const float* cst,
                               const float* tcs, float* dg) {
    return backward<float>(T, N, D, H, len, R, dout, act, cst, tcs, dg);
}
int rnntrain_lstm_backward_f64(int T, int N, int D, int H, const int64_t* len, const double* R,
                               const double* dout, const double* act, const double* cst,
                               const double* tcs, double* dg) {
    return backward<double>(T, N, D, H, len, R, dout, act, cst, tcs, dg);
}
}
