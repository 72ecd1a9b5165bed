/* kvattn.h — transformer attention and a paged KV cache for the CPU, in one header.

   What it is
   ----------
   MHA / MQA / GQA attention (one family: H query heads share G KV heads),
   causal prefill and decode over a paged KV cache (fixed block pool, block
   tables, ref-counted blocks, copy-on-write forks, salted prefix caching),
   F32 / F16 / BF16 / INT8 / INT4 / FP8 (E4M3, E5M2) cache storage
   dequantized inside the kernels (optionally Hadamard-rotated rows; over
   INT8 / INT4 keys, optionally int8 queries and integer dot products),
   sliding-window and H2O eviction, layer groups for hybrid local/global
   models, RoPE, split-K decode and batched attention over many sequences,
   and GQA and MLA (DeepSeek latent cache) layer forwards.
   C99, the C standard library only, optional OpenMP. Every function is
   `KVA_API` (default `static inline`): include the header and call it.

   The reference for engine authors is docs/API.md in the repository (every
   function, status, field, default, threading and allocation rule, with
   examples); everything whose name starts with `kva__` or `KVA__` is
   internal and may change.

   Example: a decode step of one GQA layer
   ---------------------------------------
       #include "kvattn.h"
       kva_cache_desc d = {0};
       d.n_layers = 1; d.n_kv_heads = 8; d.head_dim = 128;
       d.n_blocks = 1024;                      // 16 tokens each (the default)
       kva_cache *c; int seq;
       if (kva_cache_create(&d, &c) != KVA_OK) return 1;
       kva_seq_new(c, &seq);

       kva_attn a = {0};
       a.n_heads = 32; a.n_kv_heads = 8; a.head_dim = 128;

       for (int step = 0; step < n_steps; step++) {
           if (kva_seq_append(c, seq, 1) == KVA_ERR_FULL) break;  // preempt
           // project q [32][128], k and v [8][128] for this token, RoPE them
           kva_store(c, seq, 0, k, v, 1);
           kva_attend_cache(c, seq, 0, &a, q, 1, out);           // out [32][128]
       }
       kva_cache_destroy(c);

   Configuration (define before including)
   ---------------------------------------
   KVATTN_SIMD          KVA_SIMD_SCALAR, KVA_SIMD_AVX2, KVA_SIMD_AVX512 or
                        KVA_SIMD_NEON. Default: the best the compiler targets
                        (AVX2 needs -mavx2 -mfma -mf16c; AVX-512 adds -mavx512f
                        -mavx512bw -mavx512vl; -march=native picks for you).
                        Forcing an ISA the compiler does not target is an #error.
   KVATTN_MALLOC(n)     host allocation (default malloc); KVATTN_FREE(p).
   KVATTN_ASSERT(x)     internal invariants only (default: nothing).
   KVATTN_NO_OPENMP     ignore OpenMP even when compiled with -fopenmp.
   KVA_API              linkage of every function (default static inline).
   KVATTN_DECLARATIONS_ONLY  types and prototypes only; with
   KVATTN_IMPLEMENTATION     defined in one file: that file compiles the one
                        copy of the library (external linkage), stb-style.

   Threads (docs/API.md, "Threads"): attention calls on one cache
   (kva_attend_cache, kva_attend_batch with one plan per call, kva_seq_read)
   may run at the same time from any threads, on different sequences or on
   different layers of one sequence, with the same results as one after
   another; one plan's work units may be shared by an engine's own threads; calls that change a cache (append, store, fork, free, publish,
   truncate, ...) are serialised by the caller. Calls on different caches,
   and calls that take no cache, may run concurrently. Inside a call the
   library uses OpenMP (`n_threads`, 0 = OpenMP's default). Results are
   bit-identical for any thread count.
   No function keeps mutable state outside the structs passed to it;
   nothing prints, aborts or exits.

   License: MIT (at the end of this file).
*/
#ifndef KVATTN_H
#define KVATTN_H

#define KVATTN_VERSION_MAJOR 0
#define KVATTN_VERSION_MINOR 1
#define KVATTN_VERSION_PATCH 0
#define KVATTN_VERSION_STRING "0.1.0"

/* Table of contents
   [1] configuration
   [2] the API: types, then every public function at a glance
       --- the implementation (left out under KVATTN_DECLARATIONS_ONLY) ---
   [3] names and numerics: f16, bf16, FP8, storage types
   [4] SIMD kernels: the scalar twins, the vector mapping, AVX2, AVX-512,
       NEON, then the kernel table (the only section with ISA code)
   [5] quantization: FP8 bulk conversions and calibration, INT8 / INT4 rows,
       storing and loading one cache row
   [6] attention core: one pass over keys, split-K, merging
   [7] RoPE
   [8] paged KV cache: block pool, groups' pools, sequences, eviction,
       prefix caching, sequence streams (export / import)
   [9] cache store / attend / read (rotation first), batched attention
   [10] layers: GQA forward, [10b] MLA forward
   [11] stats
*/

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <limits.h>

/* ======================================================================
   [1] configuration
   ====================================================================== */

/* static inline by default: any number of translation units include the
   header, each with its own copy. One compiled copy instead (the stb way):
   every file includes with KVATTN_DECLARATIONS_ONLY (prototypes and types),
   one file defines KVATTN_IMPLEMENTATION before including (the definitions,
   with external linkage). */
#ifndef KVA_API
#if defined(KVATTN_DECLARATIONS_ONLY) || defined(KVATTN_IMPLEMENTATION)
#define KVA_API extern
#else
#define KVA_API static inline
#endif
#endif

#if !defined(KVATTN_MALLOC) || !defined(KVATTN_FREE)
#include <stdlib.h>
#ifndef KVATTN_MALLOC
#define KVATTN_MALLOC(n) malloc(n)
#endif
#ifndef KVATTN_FREE
#define KVATTN_FREE(p) free(p)
#endif
#endif

#ifndef KVATTN_ASSERT
#define KVATTN_ASSERT(x) ((void)0)
#endif

#define KVA_SIMD_SCALAR 0
#define KVA_SIMD_AVX2 1
#define KVA_SIMD_NEON 2
#define KVA_SIMD_AVX512 3

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVA__CAN_AVX2 1
#else
#define KVA__CAN_AVX2 0
#endif
#if KVA__CAN_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KVA__CAN_AVX512 1
#else
#define KVA__CAN_AVX512 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KVA__CAN_NEON 1
#else
#define KVA__CAN_NEON 0
#endif

#ifndef KVATTN_SIMD
#if KVA__CAN_AVX512
#define KVATTN_SIMD KVA_SIMD_AVX512
#elif KVA__CAN_AVX2
#define KVATTN_SIMD KVA_SIMD_AVX2
#elif KVA__CAN_NEON
#define KVATTN_SIMD KVA_SIMD_NEON
#else
#define KVATTN_SIMD KVA_SIMD_SCALAR
#endif
#endif

#if KVATTN_SIMD == KVA_SIMD_AVX2
#if !KVA__CAN_AVX2
#error "KVATTN_SIMD == KVA_SIMD_AVX2 needs a compiler targeting AVX2, FMA and F16C (-mavx2 -mfma -mf16c)"
#endif
#include <immintrin.h>
#elif KVATTN_SIMD == KVA_SIMD_AVX512
#if !KVA__CAN_AVX512
#error "KVATTN_SIMD == KVA_SIMD_AVX512 needs AVX-512 F, BW and VL besides AVX2, FMA and F16C (-march=x86-64-v4 -mf16c)"
#endif
#include <immintrin.h>
#elif KVATTN_SIMD == KVA_SIMD_NEON
#if !KVA__CAN_NEON
#error "KVATTN_SIMD == KVA_SIMD_NEON needs a compiler targeting AArch64 NEON"
#endif
#include <arm_neon.h>
#elif KVATTN_SIMD != KVA_SIMD_SCALAR
#error "KVATTN_SIMD must be KVA_SIMD_SCALAR, KVA_SIMD_AVX2, KVA_SIMD_AVX512 or KVA_SIMD_NEON"
#endif

#if defined(_OPENMP) && !defined(KVATTN_NO_OPENMP)
#include <omp.h>
#define KVA__OMP 1
#define KVA__PRAGMA(x) _Pragma(#x)
#define KVA__OMP_FOR(nt) KVA__PRAGMA(omp parallel for schedule(dynamic, 1) num_threads(nt) if ((nt) > 1))
#else
#define KVA__OMP 0
#define KVA__OMP_FOR(nt)
#endif

#if defined(__GNUC__) || defined(__clang__)
/* into L2, not L1 (locality 2: prefetcht1 on x86): a tile's rows arrive
   while the one before computes, and L1 fills left free for the loads that
   compute; measured on Zen 4 this halved a cold 32K-token decode */
#define KVA__PREFETCH(p) __builtin_prefetch(p, 0, 2)
#define KVA__FORCEINLINE static inline __attribute__((always_inline))
#define KVA__ALIGN(n) __attribute__((aligned(n)))
#else
#define KVA__PREFETCH(p) ((void)(p))
#define KVA__FORCEINLINE static inline
#define KVA__ALIGN(n)
#endif

/* g++ 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics
   (their `__Y = __Y` idiom for an undefined vector) once they inline here. */
#if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && KVATTN_SIMD == KVA_SIMD_AVX512
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define KVA__POP_DIAGNOSTICS 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
   [2] the API: types, then every public function at a glance
   ====================================================================== */

typedef enum {
  KVA_OK = 0,
  KVA_ERR_ARG,         /* bad argument: NULL, non-positive size, H % G != 0, ... */
  KVA_ERR_NOMEM,       /* host allocation failed */
  KVA_ERR_FULL,        /* block pool exhausted: nothing was changed */
  KVA_ERR_SEQ,         /* unknown or freed sequence id */
  KVA_ERR_UNSUPPORTED, /* valid but unsupported combination */
  KVA_ERR_SEQ_LIMIT,   /* max_seqs sequences are live: free one (no block is involved) */
  KVA_ERR_NOT_STORED,  /* the step's tokens are not all stored in that layer (kva_store first) */
  KVA_ERR_STREAM,      /* kva_seq_import, kva_prefix_load: truncated, corrupted, or not a kvattn stream / record */
  KVA_ERR_STEP         /* more tokens stored or attended than the sequence's last append added
                          (after a fork or a truncate, append the step's tokens first) */
} kva_status;

typedef enum {
  KVA_DTYPE_DEFAULT = 0,
  KVA_F32,
  KVA_F16,
  KVA_BF16,
  KVA_INT8,
  KVA_FP8_E4M3,
  KVA_FP8_E5M2,
  KVA_INT4 /* groups of 32 values along the head dimension, asymmetric: a scale and a minimum each */
} kva_dtype;

/* Attention shape and options; zero-initialise, then set the sizes. */
typedef struct {
  int n_heads, n_kv_heads, head_dim; /* H, G, D; H % G == 0 (G==H: MHA, G==1: MQA) */
  int v_dim;                         /* 0 => head_dim */
  float scale;                       /* 0 => 1/sqrt(head_dim) */
  int window;                        /* 0 => unlimited; key visible iff qpos - kpos < window */
  int n_sink;                        /* positions < n_sink stay visible under a window */
  float softcap;                     /* 0 => none; else softcap * tanh(score / softcap) */
  int n_threads;                     /* 0 => OpenMP's default; 1 => no threading */
  int q_stride, out_stride;          /* floats from one token's row to the next; 0 => packed (H*D, H*DV) */
  int k_stride, v_stride;            /* kva_attend's k and v the same way; 0 => packed (G*D, G*DV) */
  int non_causal;                    /* 1: keys after the query are visible too (encoders); a window
                                        then reaches both ways */
  float alibi_max_bias;              /* 0 => none; else ALiBi: score -= slope_h * |qpos - kpos|, the
                                        slopes of max bias b (8 in BLOOM / the paper) */
  const int32_t *tree_parent;        /* NULL => linear; else [n_q]: the new tokens form a tree (speculative
                                        drafts): query i's parent among them (< i), -1 for the cached
                                        prefix; i sees the prefix and its ancestors, at position
                                        base + depth(i) */
  int chunk_size;                    /* 0 => none; else chunked attention: a key is visible only in its
                                        own chunk, kpos / chunk_size == qpos / chunk_size (Llama 4) */
  const float *sink_logits;          /* NULL => none; else [n_heads]: a learned logit per query head that
                                        joins every softmax's denominator with no value (GPT-OSS) */
  int int_scores;                    /* 0 => float scores; 1 => over INT8 / INT4 keys, each query row is
                                        quantized to int8 (one absmax scale per token and head) and
                                        scores are integer dot products (docs/API.md, "Integer scores") */
  int int_values;                    /* 0 => float values; 1 => over INT8 / INT4 values, each tile's
                                        probabilities are quantized to 8-bit codes (the token's scale folded
                                        in) and the products over keys are integer dot products
                                        (docs/API.md, "Integer values") */
  int select_budget;                 /* 0 => read every held token; else a cache call reads, per query token
                                        and KV head, the blocks whose key bounds promise the largest
                                        scores, select_budget tokens in all (kva_cache_desc.block_bounds;
                                        docs/API.md, "Block selection") */
  int select_sink, select_recent;    /* with select_budget: the blocks holding the first select_sink and
                                        the last select_recent tokens are always read (within the budget) */
} kva_attn;

/* RoPE. theta 0 and inv_freq NULL => no rotation. */
typedef struct {
  float theta;
  int dim;               /* rotated leading values of a head; 0 => the whole head */
  int interleaved;       /* 0: pairs (x[i], x[i+dim/2]) (NeoX/HF); 1: (x[2i], x[2i+1]) */
  const float *inv_freq; /* NULL => theta^(-2i/dim); else [dim/2] */
  const float *table;    /* NULL, or kva_rope_table_init's cos/sin of positions 0 .. table_len-1 */
  int table_len;
} kva_rope;

/* FP8 cache scales (kva_cache_desc.k_scale / v_scale) from sample K or V:
   KVA_CALIB_ABSMAX   max|x| / format max (448, 57344): nothing saturates;
   KVA_CALIB_VLLM_K   max|x| / 200 and KVA_CALIB_VLLM_V max|x| / 100 (vLLM's
                      "calculate" rule: headroom for values larger than the sample's);
   KVA_CALIB_MSE      (default) of vLLM's two scales and ABSMAX's times 2^(-k/8),
                      k = 0..40, the
                      one with the least round-trip squared error over the whole
                      sample (43 vectorised encodes of it): trading a few
                      saturated outliers for resolution where values are dense.
   Non-finite values are ignored; an all-zero or empty sample gives 1. The
   result is finite, > 0 and accepted by kva_cache_create.
   kva_fp8_calibrate_heads: the same rule per head of one layer's sample
   x [n_tokens][n_heads][head_dim], into scales[n_heads] (for
   kva_cache_desc.head_k_scale / head_v_scale, one layer's row). */
typedef enum { KVA_CALIB_MSE = 0, KVA_CALIB_ABSMAX, KVA_CALIB_VLLM_K, KVA_CALIB_VLLM_V } kva_calib;

typedef enum { KVA_CACHE_KV = 0, KVA_CACHE_LATENT } kva_cache_kind;

/* What eviction a cache's sequences may use, so a cache that will not evict
   pays nothing for it: ALL keeps a position and an H2O score per token, KV
   head and layer (8 bytes); WINDOW positions only (4); NONE neither
   (positions are the slots). */
typedef enum { KVA_EVICT_SUPPORT_ALL = 0, KVA_EVICT_SUPPORT_WINDOW, KVA_EVICT_SUPPORT_NONE } kva_evict_support;

/* kva_cache_desc.rotate: which rows a cache stores rotated. The transform is
   the Sylvester Hadamard matrix scaled by 1/sqrt(n), orthonormal and its own
   inverse: over a whole head when head_dim (v_dim) is a power of two up to
   1024, else over each group of 32 values (a last shorter group as is). */
enum { KVA_ROTATE_K = 1, KVA_ROTATE_V = 2 };

/* Layer groups (hybrid local/global models): the layers of a group share an
   attention span, and a WINDOW or CHUNK group keeps only the tokens its
   layers can still see, in a pool of its own, returning the rest as the
   sequence grows. FULL keeps every token (the main pool). */
typedef enum { KVA_SPAN_FULL = 0, KVA_SPAN_WINDOW, KVA_SPAN_CHUNK } kva_span_kind;
#define KVA_MAX_GROUPS 8 /* kva_cache_desc.n_groups at most */
typedef struct {
  int kind;       /* a kva_span_kind */
  int window;     /* WINDOW: a key is visible iff qpos - kpos < window (> 0) */
  int n_sink;     /* WINDOW: positions < n_sink stay visible (and held) */
  int chunk_size; /* CHUNK: a key is visible iff kpos / chunk_size == qpos / chunk_size (> 0) */
  int n_blocks;   /* WINDOW / CHUNK: the group's own pool; 0 => enough for max_seqs sequences at the
                     span, plus a block each (at most the main pool's n_blocks) */
} kva_layer_group;

typedef struct {
  int kind;                       /* a kva_cache_kind (an int, so that `= {0}` compiles as C++ too);
                                     LATENT: one vector per token, V = its first v_dim values (MLA) */
  int n_layers, n_kv_heads, head_dim, v_dim; /* v_dim 0 => head_dim */
  int block_size;                 /* tokens per block; 0 => 16 */
  int n_blocks;                   /* pool size; 0 => derived from max_bytes */
  size_t max_bytes;               /* when n_blocks == 0: the whole footprint (kva_cache_size) at most */
  kva_dtype dtype;                /* storage of K (and V); DEFAULT => KVA_F16 */
  kva_dtype v_dtype;              /* DEFAULT => same as dtype */
  const kva_dtype *layer_dtype;   /* NULL or [n_layers]: per-layer override of both */
  float k_scale, v_scale;         /* FP8: store fp8(x/scale); > 0 unless the arrays below give every
                                     FP8 layer's scales (LATENT: k_scale only) */
  const float *layer_k_scale, *layer_v_scale; /* NULL or [n_layers]: per-layer FP8 scales (over k/v_scale) */
  const float *head_k_scale, *head_v_scale;   /* NULL or [n_layers][n_kv_heads]: per layer and KV head
                                                 (over both); entries of non-FP8 layers are not read */
  int max_seqs;                   /* live sequences at once; 0 => 256 */
  int max_seq_len;                /* tokens one sequence may hold (sizes its block table); 0 => the pool */
  int evict_support;              /* a kva_evict_support; 0 => ALL */
  int prefix_max_age;             /* 0 => none; else a published block unused for this many
                                     kva_seq_append calls (cache-wide) is forgotten */
  int rotate;                     /* 0 => off; else KVA_ROTATE_K | KVA_ROTATE_V: those rows are stored
                                     times an orthonormal Walsh-Hadamard transform (queries and outputs
                                     follow), spreading outlier channels before quantization (KV only) */
  int block_bounds;               /* 0 => none; 1 => per block, layer and KV head the channel-wise minimum
                                     and maximum of the stored keys (F16, rounded outward), which
                                     kva_attn.select_budget ranks blocks by */
  kva_dtype demote_dtype;         /* DEFAULT => no demoted pool; else F32, F16, BF16, INT8 or INT4: the type
                                     of the second pool, where eviction with kva_evict.demote_dtype moves
                                     tokens instead of deleting them (KV caches without layer groups) */
  int demote_blocks;              /* the demoted pool's blocks (of block_size tokens); 0 => n_blocks */
  int n_groups;                   /* 0 => one FULL group; else groups[n_groups], at most KVA_MAX_GROUPS */
  const kva_layer_group *groups;
  const int *layer_group;         /* NULL => every layer in group 0; else [n_layers] group indices.
                                     With a WINDOW or CHUNK group the cache keeps no positions or
                                     scores (as evict_support NONE): its sequences do not evict */
  void *(*alloc_fn)(size_t size, size_t align, void *user);
  void (*free_fn)(void *p, size_t size, void *user);
  void *user;
  /* A second tier behind the prefix cache (docs/API.md, "Prefix tier"): both NULL, or both set. spill gets
     each published block the cache forgets to make room or by age, as one self-describing, checksummed
     record of kva_prefix_record_size bytes under its key; fetch, when a prefix lookup misses in memory,
     is asked for the next block's key and copies its record into rec (cap bytes), setting *size. Records
     fetched are verified before use; a status other than KVA_OK from either is a miss. KV caches
     without layer groups. */
  kva_status (*spill)(void *user, const uint8_t key[32], const void *rec, size_t size);
  kva_status (*fetch)(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size);
  void *tier_user;
  /* NULL, or called when a call on this cache refuses (any status but KVA_OK), from the calling
     thread before the call returns: the kvattn.h function whose check failed and which rule was
     broken (the condition as written there, or a sentence). Static strings; never called on success. */
  void (*on_error)(void *user, kva_status status, const char *function, const char *why);
} kva_cache_desc;

typedef struct {
  int n_blocks;         /* pool size */
  int blocks_used;      /* referenced by a live sequence */
  int blocks_cached;    /* published, referenced by none */
  int blocks_free;      /* neither; used + cached + free == n_blocks */
  int n_seqs;           /* live sequences */
  size_t block_bytes;   /* one block, all layers, K+V+scales */
  size_t bytes_total;   /* the whole pool */
  size_t bytes_meta;    /* bookkeeping: tables, positions, sequence records */
  size_t bytes_footprint; /* the whole allocation: pool + bookkeeping (what kva_cache_size said) */
  long tokens_held;     /* sum of kva_seq_len over live sequences */
  long prefix_queries, prefix_hits; /* tokens asked for / tokens reused by kva_seq_new_prefix */
  /* occupancy and event counters: */
  long token_slots;     /* token slots in the used blocks (blocks_used * block_size): */
                        /* tokens_held / token_slots is the occupancy (shared blocks count once) */
  long cow_copies;      /* blocks copied because an append wrote into a shared block */
  long appends_failed;  /* kva_seq_append calls that returned KVA_ERR_FULL */
  long prefix_forgotten;/* published blocks dropped by prefix_max_age or recycled for space */
  /* layer groups (kva_cache_desc.groups): */
  size_t bytes_used;    /* block bytes live sequences hold: the main pool's blocks_used and every
                           WINDOW / CHUNK group's blocks in use (shared blocks count once) */
  int group_blocks;     /* blocks in the WINDOW / CHUNK groups' pools, together */
  int group_blocks_used;/* of those, held by live sequences (blocks only the prefix cache holds are spare) */
  /* the demoted pool (kva_cache_desc.demote_dtype), counted in bytes_total and bytes_used too: */
  int demote_blocks;    /* its size */
  int demote_blocks_used;
  size_t demote_block_bytes; /* one block, all layers, K+V+scales, and its positions */
  /* the prefix tier (kva_cache_desc.spill / fetch), in blocks: */
  long tier_spills;        /* records handed to spill (accepted or not) */
  long tier_spill_errors;  /* of those, refused by spill */
  long tier_fetch_hits;    /* records fetched, verified and reused */
  long tier_fetch_misses;  /* fetch calls that returned a status other than KVA_OK */
  long tier_fetch_refused; /* records fetched but refused by the checks (nothing used) */
  long tier_loads;         /* records taken in by kva_prefix_load */
} kva_cache_stats;

/* One sequence's memory (kva_seq_get_stats), to report and bill a request. */
typedef struct {
  long tokens;           /* held now (kva_seq_len) */
  long tokens_evicted;   /* positions eviction deleted (kva_seq_pos - kva_seq_len - tokens_demoted) */
  long tokens_demoted;   /* held in the demoted region (kva_seq_demoted) */
  long head_slots_empty; /* (layer, KV head, slot) triples below kva_seq_len holding no token: what per-layer
                            or per-head budgets leave unused of the slots (kva_evict.layer_weight, share_heads) */
  int demote_blocks;     /* its blocks (own, never shared), counted in bytes and bytes_own */
  int blocks;            /* blocks its tables hold, every layer group's (a block holds all its group's layers) */
  int blocks_shared;     /* of those, also held by another sequence or published in the prefix cache */
  size_t bytes;          /* block bytes of those blocks */
  size_t bytes_shared;   /* of which in shared blocks; bytes - bytes_shared is its own: */
  size_t bytes_own;      /* what freeing the sequence returns to the free pool now */
  double bytes_prorated; /* each block's bytes divided among the live sequences holding it: over all
                            live sequences these add up to kva_cache_stats.bytes_used */
  size_t bytes_meta;     /* its slot's bookkeeping (record, block tables), preallocated at create */
} kva_seq_stats;

typedef enum { KVA_EVICT_NONE = 0, KVA_EVICT_WINDOW, KVA_EVICT_H2O, KVA_EVICT_SCORE } kva_evict_kind;

/* What an eviction scorer (kva_evict.score) sees: one layer and KV head of a
   sequence, its held tokens oldest first. Valid during the call only. */
typedef struct {
  int seq, layer, kv_head;
  int n_layers, n_kv_heads;
  int n;                  /* tokens held */
  int keep;               /* how many of them stay: the protected ones and the highest scores */
  int head_dim, v_dim;
  const int32_t *pos;     /* [n] positions, ascending (token i is the i-th oldest held) */
  const float *k;         /* [n][head_dim] the keys as kva_seq_read returns them */
  const float *v;         /* [n][v_dim] the values, NULL in a KVA_CACHE_LATENT cache */
  const float *attn_sum;  /* [n] attention accumulated while the policy had accumulate = 1, else NULL */
} kva_score_view;
/* Writes view->n scores (higher stays; not NaN) and returns KVA_OK, or an
   error status: the eviction is then refused and nothing changes. */
typedef kva_status (*kva_score_fn)(void *user, const kva_score_view *view, float *scores);

/* Eviction policy of a sequence. WINDOW keeps the first n_sink positions and
   the newest tokens (budget in all); H2O keeps the first n_sink positions,
   the n_recent newest and the tokens with the highest accumulated attention;
   SCORE keeps the first n_sink positions, the n_recent newest and the
   tokens `score` ranks highest (docs/API.md, "Eviction scorers"). */
typedef struct {
  int kind;     /* a kva_evict_kind (an int, so that `= {0}` compiles as C++ too) */
  int budget;   /* tokens held at most (after the append, unless nothing is evictable) */
  int n_sink;
  int n_recent; /* H2O and SCORE */
  int rollback; /* 1: an append evicts only what the tokens held before it exceed the budget by, so
                   truncating within the newest step (a rejected draft) never costs a held token;
                   up to budget + the step's tokens are held */
  kva_score_fn score; /* SCORE: required */
  void *score_user;   /* SCORE: passed to score */
  int accumulate;     /* SCORE: 1 => attention accumulates per token as H2O's does (view.attn_sum) */
  kva_dtype demote_dtype; /* DEFAULT: evicted tokens are deleted; else the cache's kva_cache_desc.demote_dtype:
                             they move, at that precision, into the sequence's demoted region, still attended */
  int demote_budget;  /* demoted tokens held at most (0: as many as a block table holds), the earliest
                         demoted deleted first */
  /* SCORE, budgets that differ by layer and head (docs/API.md, "Per-layer and per-head budgets"); a KV head
     keeping fewer tokens than the sequence has slots leaves the rest empty (KVA_POS_EMPTY) */
  const float *layer_weight; /* NULL, or [n_layers] (kept by pointer: it must outlive the policy): layer l
                                keeps floor(budget * layer_weight[l]) tokens per KV head (PyramidKV) */
  int share_heads;    /* 1: a layer's KV heads share n_kv_heads times its budget, the slots going to the
                         highest scores over all of them (Ada-KV) */
} kva_evict;

/* Built-in scorers (kva_evict.score), each a published rule: docs/API.md,
   "Eviction scorers". kva_score_key_norm takes no user data (NULL). */
typedef struct {
  const float *q;     /* [n_layers][n_q][n_heads][head_dim]: the queries that judge, per layer */
  int n_q;            /* 1..: queries per layer (TOVA: the current one; SnapKV: the observation window) */
  int n_heads;        /* query heads, a multiple of the cache's n_kv_heads */
  float scale;        /* 0 => 1 / sqrt(head_dim) */
  const int32_t *q_pos; /* [n_q] their positions (NULL: the last n_q held positions); a query sees keys at
                           or before its own position */
  int pool;           /* SnapKV: average-pooling width over neighbouring slots, odd (0 or 1: none) */
  size_t layer_stride; /* floats from one layer's queries to the next (0: n_q x n_heads x head_dim) */
} kva_score_queries;

typedef struct kva_cache kva_cache; /* opaque: its members are not part of the API */
typedef struct kva_batch kva_batch; /* a batched-attention plan (kva_batch_plan) */

typedef enum { KVA_FITS_NOW = 0, KVA_FITS_LATER, KVA_FITS_NEVER } kva_fit;

typedef struct {
  int d_model;
  kva_attn attn;                                     /* n_heads, n_kv_heads, head_dim, window, ...; v_dim 0 */
  const float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo; /* [H*D][d], [G*D][d], [G*D][d], [d][H*D]; biases may be NULL */
  kva_rope rope;
  void *workspace;        /* NULL, or caller memory for the call's temporaries (float-aligned): */
  size_t workspace_bytes; /* when >= kva_gqa_workspace_bytes(), the call allocates nothing */
} kva_gqa_layer;

typedef struct {
  int d_model, n_heads, d_latent, d_nope, d_rope, d_v;
  float scale;                       /* 0 => 1/sqrt(d_nope + d_rope) */
  const float *wq, *bq;              /* [H*(d_nope+d_rope)][d]: per head nope then rope */
  int q_lora_rank;                   /* 0 => wq; else q = wq_b . RMSNorm(wq_a . x) (V2/V3) */
  const float *wq_a, *q_norm, *wq_b; /* [r][d], [r] gain (NULL: 1), [H*(d_nope+d_rope)][r] */
  const float *w_dkv, *b_dkv;        /* [d_latent][d] -> c_kv */
  const float *kv_norm;              /* NULL: no norm; else c / sqrt(mean(c^2) + eps) * gain */
  float norm_eps;                    /* 0 => 1e-6 */
  const float *w_kr, *b_kr;          /* [d_rope][d] -> shared rope key; d_rope 0: none */
  const float *w_uk, *b_uk;          /* [H*d_nope][d_latent] */
  const float *w_uv, *b_uv;          /* [H*d_v][d_latent] */
  const float *wo, *bo;              /* [d][H*d_v] */
  kva_rope rope;                     /* on q's rope part and k_pe */
  int naive;                         /* 1: rebuild K, V per step; 0: absorbed */
  int int_scores;                    /* absorbed over an INT8 / INT4 latent cache: kva_attn.int_scores */
  int int_values;                    /* absorbed over an INT8 / INT4 latent cache: kva_attn.int_values */
  int n_threads;                     /* 0 => OpenMP's default */
  void *workspace;                   /* NULL, or caller memory for the call's temporaries (float-aligned): */
  size_t workspace_bytes;            /* when >= kva_mla_workspace_bytes(), the call allocates nothing */
} kva_mla_layer;

/* ---- API at a glance: every public function (docs/API.md has the details) ---- */

/* names of statuses, storage types and the compiled kernels */
KVA_API const char *kva_status_str(kva_status s);
KVA_API const char *kva_simd_name(void);
KVA_API const char *kva_dtype_name(kva_dtype t);

/* numerics: F16, BF16 and FP8 conversions; FP8 scale calibration */
KVA_API float kva_f16_to_f32(uint16_t h);
KVA_API uint16_t kva_f32_to_f16(float f);
KVA_API float kva_bf16_to_f32(uint16_t h);
KVA_API uint16_t kva_f32_to_bf16(float f);
KVA_API float kva_e4m3_to_f32(uint8_t b);
KVA_API uint8_t kva_f32_to_e4m3(float x);
KVA_API float kva_e5m2_to_f32(uint8_t b);
KVA_API uint8_t kva_f32_to_e5m2(float x);
KVA_API void kva_f32_to_e4m3_n(uint8_t *dst, const float *src, size_t n);
KVA_API void kva_f32_to_e5m2_n(uint8_t *dst, const float *src, size_t n);
KVA_API void kva_e4m3_to_f32_n(float *dst, const uint8_t *src, size_t n);
KVA_API void kva_e5m2_to_f32_n(float *dst, const uint8_t *src, size_t n);
KVA_API kva_status kva_fp8_calibrate(kva_dtype t, const float *x, size_t n, kva_calib rule, float *scale);
KVA_API kva_status kva_fp8_calibrate_heads(kva_dtype t, const float *x, int n_tokens, int n_heads, int head_dim,
                                           kva_calib rule, float *scales);

/* attention on plain arrays; merging partial results */
KVA_API const char *kva_attn_check(const kva_attn *a);
KVA_API kva_status kva_attend(const kva_attn *a, const float *q, int n_q, const int32_t *q_pos, const float *k,
                              const float *v, int n_kv, const int32_t *kv_pos, float *out, float *lse);
KVA_API kva_status kva_merge_lse(float *out, float *lse, const float *out_b, const float *lse_b, int n_rows, int dv);

/* RoPE */
KVA_API size_t kva_rope_table_floats(const kva_rope *r, int head_dim, int n_pos);
KVA_API kva_status kva_rope_table_init(const kva_rope *r, int head_dim, int n_pos, float *table);
KVA_API kva_status kva_rope_apply_strided(const kva_rope *r, float *x, int stride, int n_tokens, int n_heads,
                                          int head_dim, const int32_t *pos);
KVA_API kva_status kva_rope_apply(const kva_rope *r, float *x, int n_tokens, int n_heads, int head_dim,
                                  const int32_t *pos);

/* the cache */
KVA_API size_t kva_cache_bytes_per_token(const kva_cache_desc *d);
KVA_API kva_status kva_cache_size(const kva_cache_desc *d, size_t *bytes);
KVA_API kva_status kva_cache_create(const kva_cache_desc *d, kva_cache **out);
KVA_API void kva_cache_destroy(kva_cache *c);
KVA_API void kva_cache_get_stats(const kva_cache *c, kva_cache_stats *st);
KVA_API kva_status kva_seq_get_stats(const kva_cache *c, int seq, kva_seq_stats *st);

/* sequences */
KVA_API kva_status kva_seq_new(kva_cache *c, int *seq);
KVA_API kva_status kva_seq_free(kva_cache *c, int seq);
KVA_API int kva_seq_len(const kva_cache *c, int seq);
KVA_API int kva_seq_pos(const kva_cache *c, int seq);
KVA_API kva_status kva_seq_append(kva_cache *c, int seq, int n_tokens);
KVA_API kva_fit kva_seq_fits(const kva_cache *c, int seq, int n_tokens, int *blocks_needed);
KVA_API kva_status kva_seq_append_all(kva_cache *c, const int *seqs, const int *n_tokens, int n_seqs);
KVA_API kva_status kva_seq_fork(kva_cache *c, int src, int *dst);
KVA_API kva_status kva_seq_truncate(kva_cache *c, int seq, int n_keep);
KVA_API kva_status kva_seq_set_evict(kva_cache *c, int seq, const kva_evict *e);
KVA_API kva_status kva_seq_compress(kva_cache *c, int seq, int budget);
KVA_API kva_status kva_score_key_norm(void *user, const kva_score_view *view, float *scores);
KVA_API kva_status kva_score_attention(void *user, const kva_score_view *view, float *scores);
KVA_API kva_status kva_pyramid_weights(int n_layers, int budget, int n_window, float beta, float *weights);
KVA_API kva_status kva_seq_accept(kva_cache *c, int seq, int n_new, const int32_t *keep, int n_keep);
KVA_API kva_status kva_seq_export(kva_cache *c, int seq, void *buf, size_t cap, size_t *size);
KVA_API kva_status kva_seq_import(kva_cache *c, const void *buf, size_t size, int *seq);

/* prefix caching */
KVA_API kva_status kva_seq_publish(kva_cache *c, int seq, const int32_t *tokens, int n_tokens, uint64_t salt);
KVA_API kva_status kva_seq_new_prefix(kva_cache *c, const int32_t *tokens, int n_tokens, uint64_t salt, int *seq,
                                      int *n_reused);
KVA_API kva_status kva_cache_reset_prefix(kva_cache *c);
KVA_API size_t kva_prefix_record_size(const kva_cache *c);
KVA_API kva_status kva_prefix_save(kva_cache *c, int *n_saved);
/* kva_prefix_load's *outcome: the record was taken in, was already in memory, or names a parent not in memory */
#define KVA_PREFIX_LOADED 1
#define KVA_PREFIX_IN_MEMORY 0
#define KVA_PREFIX_NO_PARENT (-1)
KVA_API kva_status kva_prefix_load(kva_cache *c, const void *record, size_t size, int *outcome);
KVA_API void kva_prefix_key(const uint8_t parent[32], uint64_t salt, const int32_t *tokens, int n_tokens,
                            uint8_t key[32]);
KVA_API void kva_sha256(const void *data, size_t n, uint8_t digest[32]);

/* store, attend and read a sequence */
KVA_API kva_status kva_store(kva_cache *c, int seq, int layer, const float *k, const float *v, int n_tokens);
KVA_API kva_status kva_store_strided(kva_cache *c, int seq, int layer, int offset, const float *k, int k_stride,
                                     const float *v, int v_stride, int n_tokens);
KVA_API kva_status kva_store_at(kva_cache *c, int seq, int layer, int offset, const float *k, const float *v,
                                int n_tokens);
KVA_API kva_status kva_attend_cache(kva_cache *c, int seq, int layer, const kva_attn *a, const float *q, int n_q,
                                    float *out);
KVA_API kva_status kva_attend_cache_lse(kva_cache *c, int seq, int layer, const kva_attn *a, const float *q, int n_q,
                                        float *out, float *lse);
KVA_API kva_status kva_seq_read(const kva_cache *c, int seq, int layer, int slot, float *k, float *v,
                                int32_t *pos);
/* kva_seq_read's position of a slot a KV head leaves empty (per-layer or per-head budgets:
   kva_evict.layer_weight, share_heads); its rows read back as zeros and attention never sees it */
#define KVA_POS_EMPTY INT32_MAX
KVA_API int kva_seq_demoted(const kva_cache *c, int seq);
KVA_API kva_status kva_seq_read_demoted(const kva_cache *c, int seq, int layer, int slot, float *k, float *v,
                                        int32_t *pos);

/* batched attention over many sequences */
KVA_API kva_status kva_batch_plan(kva_cache *c, const kva_attn *a, const int *seqs, const int *n_q, int n_seqs,
                                  kva_batch **plan);
KVA_API kva_status kva_attend_batch(kva_cache *c, kva_batch *b, int layer, const float *q, float *out);
KVA_API kva_status kva_attend_batch_lse(kva_cache *c, kva_batch *b, int layer, const float *q, float *out,
                                        float *lse);
KVA_API kva_status kva_batch_replan(kva_cache *c, const kva_attn *a, const int *seqs, const int *n_q, int n_seqs,
                                    kva_batch **plan);
KVA_API void kva_batch_free(kva_batch *b);
/* running a plan from the engine's own threads (kva_attend_batch does these three) */
KVA_API kva_status kva_batch_prepare(kva_cache *c, kva_batch *b, int layer, const float *q, float *out, float *lse);
KVA_API int kva_batch_n_units(const kva_batch *b);
KVA_API int kva_batch_n_merges(const kva_batch *b);
KVA_API kva_status kva_batch_run_units(kva_batch *b, int begin, int end);
KVA_API kva_status kva_batch_run_merges(kva_batch *b, int begin, int end);

/* layers */
KVA_API size_t kva_gqa_workspace_bytes(const kva_gqa_layer *L, int n_tokens);
KVA_API size_t kva_mla_workspace_bytes(const kva_mla_layer *L, int n_tokens, int seq_len);
KVA_API kva_status kva_gqa_forward(const kva_gqa_layer *L, kva_cache *c, int seq, int layer, const float *x,
                                   int n_tokens, float *y);
KVA_API kva_status kva_mla_forward(const kva_mla_layer *L, kva_cache *c, int seq, int layer, const float *x,
                                   int n_tokens, float *y);

/* Everything below is the implementation. KVATTN_DECLARATIONS_ONLY leaves
   it out (unless KVATTN_IMPLEMENTATION is defined too). */
#if !defined(KVATTN_DECLARATIONS_ONLY) || defined(KVATTN_IMPLEMENTATION)

/* ======================================================================
   [3] names and numerics: f16 and bf16 (IEEE, round to nearest even), FP8
   ====================================================================== */

KVA_API const char *kva_status_str(kva_status s) {
  switch (s) {
    case KVA_OK: return "ok";
    case KVA_ERR_ARG: return "invalid argument";
    case KVA_ERR_NOMEM: return "out of host memory";
    case KVA_ERR_FULL: return "block pool exhausted";
    case KVA_ERR_SEQ: return "unknown or freed sequence";
    case KVA_ERR_UNSUPPORTED: return "unsupported combination";
    case KVA_ERR_SEQ_LIMIT: return "sequence limit reached (max_seqs live)";
    case KVA_ERR_NOT_STORED: return "tokens appended but not stored in every layer attended or published";
    case KVA_ERR_STREAM: return "not a valid kvattn sequence stream or prefix record (truncated or corrupted)";
    case KVA_ERR_STEP: return "more tokens than the sequence's last append added (append the step first)";
  }
  return "unknown status";
}

KVA_API const char *kva_dtype_name(kva_dtype t) {
  switch (t) {
    case KVA_DTYPE_DEFAULT: return "default";
    case KVA_F32: return "f32";
    case KVA_F16: return "f16";
    case KVA_BF16: return "bf16";
    case KVA_INT8: return "int8";
    case KVA_FP8_E4M3: return "fp8_e4m3";
    case KVA_FP8_E5M2: return "fp8_e5m2";
    case KVA_INT4: return "int4";
  }
  return "?";
}


static inline uint32_t kva__f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float kva__bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

KVA_API float kva_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float */
    float mag = (float)man * (1.0f / 16777216.0f);
    return kva__bits_f32(kva__f32_bits(mag) | sign);
  }
  if (exp == 31) return kva__bits_f32(sign | 0x7f800000u | (man << 13));
  return kva__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

KVA_API uint16_t kva_f32_to_f16(float f) {
  uint32_t x = kva__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
    return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and Inf) */
  if (x < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
    uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, shift, q, rem, half;
    if (e < 102) return sign; /* < 2^-25: rounds to zero */
    shift = 126 - e;          /* value / 2^-24 = m * 2^-shift, 14 <= shift <= 24 */
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  x = x + 0xfffu + ((x >> 13) & 1u) - (112u << 23);
  return (uint16_t)(sign | (x >> 13));
}

KVA_API float kva_bf16_to_f32(uint16_t h) { return kva__bits_f32((uint32_t)h << 16); }

KVA_API uint16_t kva_f32_to_bf16(float f) {
  uint32_t x = kva__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* FP8 (OCP 8-bit floating point rev 1.0). E4M3 is "E4M3FN": bias 7, max 448,
   no infinities, NaN only S.1111.111. E5M2: bias 15, max 57344, IEEE-like.
   Encoding rounds to nearest even and saturates: finite values and
   infinities beyond the range become the largest finite value of that
   sign (what a cache wants; PyTorch's casts give NaN instead). NaN stays NaN. */
static inline uint8_t kva__f32_to_fp8(float f, int exp_bits, int man_bits, uint8_t max_code, uint8_t nan_code) {
  uint32_t x = kva__f32_bits(f), e, shift, code;
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  int bias = (1 << (exp_bits - 1)) - 1;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return (uint8_t)(sign | nan_code);
  e = x >> 23;
  if ((int)e - 127 < 1 - bias) { /* below the smallest normal: subnormal or zero */
    uint32_t m = (x & 0x7fffffu) | 0x800000u, q, rem, half;
    if (e == 0) return sign;    /* f32 subnormals are far below any fp8 subnormal */
    shift = (uint32_t)(151 - bias - man_bits) - e; /* value / unit = m * 2^-shift */
    if (shift >= 25) return sign;
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q);
  }
  shift = (uint32_t)(23 - man_bits);
  if (x >= 0x7f800000u) return (uint8_t)(sign | max_code);                           /* infinity */
  if ((int)e - 127 > bias + 1) return (uint8_t)(sign | max_code);                    /* far beyond */
  x = x + ((1u << (shift - 1)) - 1u) + ((x >> shift) & 1u) - ((uint32_t)(127 - bias) << 23);
  code = x >> shift;
  return (uint8_t)(sign | (code > max_code ? max_code : code));
}

KVA_API float kva_e4m3_to_f32(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) return kva__bits_f32((b & 0x80u ? 0x80000000u : 0u) | 0x7fc00000u);
  v = e == 0 ? (float)m * (1.0f / 512.0f) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return b & 0x80u ? -v : v;
}
KVA_API uint8_t kva_f32_to_e4m3(float x) { return kva__f32_to_fp8(x, 4, 3, 0x7e, 0x7f); }
/* E5M2 is the top byte of an F16. */
KVA_API float kva_e5m2_to_f32(uint8_t b) { return kva_f16_to_f32((uint16_t)(b << 8)); }
KVA_API uint8_t kva_f32_to_e5m2(float x) { return kva__f32_to_fp8(x, 5, 2, 0x7b, 0x7f); }

/* An FP8 format as the vector encoders see it. Below the smallest normal,
   |x| + 2^magic_exp rounds |x| to whole subnormal units in one float add
   (round to nearest even, as the FPU does), and the sum's low bits are the
   code; above it the code is the rounded, rebiased top bits. */
typedef struct {
  uint32_t min_normal;  /* bits of the smallest normal */
  uint32_t magic;       /* bits of 2^(23 + log2 of the subnormal unit) */
  int shift;            /* 23 - mantissa bits */
  uint32_t rebias;      /* (127 - bias) << 23 */
  uint32_t max_code, nan_code;
  int e5m2;
} kva__fp8_format;
static const kva__fp8_format kva__e4m3_format = {121u << 23, 141u << 23, 20, 120u << 23, 0x7e, 0x7f, 0};
static const kva__fp8_format kva__e5m2_format = {113u << 23, 134u << 23, 21, 112u << 23, 0x7b, 0x7f, 1};


/* Bytes of one stored element; 0 for types that cannot be cache storage
   (and for INT4, whose rows kva__row_bytes measures). */
static inline size_t kva__dtype_size(kva_dtype t) {
  switch (t) {
    case KVA_F32: return 4;
    case KVA_F16: case KVA_BF16: return 2;
    case KVA_INT8: case KVA_FP8_E4M3: case KVA_FP8_E5M2: return 1;
    default: return 0;
  }
}

/* INT4 rows are groups of 32 values, each [f16 scale][f16 min][16 bytes of
   codes, two per byte, the lower element in the low nibble] (20 bytes, as
   llama.cpp's q4_1); a last, shorter group has the codes it needs. Element
   i: group i / 32 at byte 20 * (i / 32), so a prefix of a row is a row too
   (MLA's V). */
#define KVA__I4_GROUP 32
#define KVA__I4_GROUP_BYTES 20
#define KVA__I4_PARAM_BYTES 4

/* Bytes of one token of one head of dim values in type t (INT8 with its scale, INT4 with its groups'). */
static inline size_t kva__row_bytes(kva_dtype t, int dim) {
  if (t == KVA_INT4) {
    int rest = dim % KVA__I4_GROUP;
    return (size_t)(dim / KVA__I4_GROUP) * KVA__I4_GROUP_BYTES +
           (rest ? KVA__I4_PARAM_BYTES + (size_t)(rest + 1) / 2 : 0);
  }
  return kva__dtype_size(t) * (size_t)dim + (t == KVA_INT8 ? sizeof(float) : 0);
}

/* ======================================================================
   [4] SIMD kernels
   Two tile kernels do the arithmetic of attention, for every storage type:
     dot_tile   scores[r*lds + j] = q_r . k_j     (r < nr query rows, j < nk keys)
     vacc_tile  acc_r += sum_j p[r*ldp + j] * v_j
   dot_tile takes more than four rows (a pass of KVA__WIDE_ROWS and up, where
   an ISA has a vector one) to wdot_tile: the same scores, keys along the lanes.
   Each is one force-inlined function per ISA (`_scalar`, `_avx2`, `_avx512`,
   `_neon`) taking the storage type and the number of query rows as
   parameters. The dispatchers at the end of this section call it with both
   constant, so the compiler specialises it, as xxHash does its inner loop:
   the row loader's switch on the type folds to the few instructions of that
   type, and the loops over rows unroll into named registers. The scalar twin
   is always compiled; tests compare every compiled kernel with it.

   A "row" is one key or value vector of one KV head in its storage type.
   Kernels take a tile of rows as pointers, so the same kernel reads plain
   arrays, paged blocks and the slots eviction compacts. A quantized row's
   scale multiplies the finished dot product and the probability, never each
   element. fp8_scale is the FP8 tensor scale of the rows (K's or V's).
   ====================================================================== */

#define KVA__TILE 64     /* keys per tile: a tile's K and V stay in L1/L2 */
#define KVA__MAXROWS 64  /* query rows (query x head) handled per pass */
#define KVA__NR 4        /* query rows per register block */
#define KVA__SPLIT_MIN 1024   /* split-K: fewest keys per split */
#define KVA__SPLIT_TARGET 8   /* split-K: work units a call aims for */
#define KVA__MAXSPLIT 16
/* floats of split-K partials on the calling thread's stack (64.5 KiB): four
   splits of 32 rows of 128 + 1 floats, so MQA decode with 32 heads of 128
   still splits four ways; larger shapes split less. On the stack, not in the
   cache, so that attention calls on one cache can run at the same time. */
#define KVA__STACK_SCRATCH 16512

/* X(a, b) for a, b in 0..3: the SIMD kernels' 4 x 4 blocks of accumulators
   are spelled out as named variables through it, so that they stay in
   registers (compilers spill loops over arrays of vectors). */
#define KVA__EACH_4X4(X) \
  X(0, 0) X(0, 1) X(0, 2) X(0, 3) X(1, 0) X(1, 1) X(1, 2) X(1, 3) \
  X(2, 0) X(2, 1) X(2, 2) X(2, 3) X(3, 0) X(3, 1) X(3, 2) X(3, 3)
/* the same, X(V, a, b), for the loops written over a vector mapping V */
#define KVA__EACH_4X4_OF(X, V) \
  X(V, 0, 0) X(V, 0, 1) X(V, 0, 2) X(V, 0, 3) X(V, 1, 0) X(V, 1, 1) X(V, 1, 2) X(V, 1, 3) \
  X(V, 2, 0) X(V, 2, 1) X(V, 2, 2) X(V, 2, 3) X(V, 3, 0) X(V, 3, 1) X(V, 3, 2) X(V, 3, 3)

/* An INT4 element's group: its scale and minimum, and where its codes start. */
KVA__FORCEINLINE const uint8_t *kva__i4_group(const void *row, int i, float *scale, float *min) {
  const uint8_t *g = (const uint8_t *)row + (size_t)(i / KVA__I4_GROUP) * KVA__I4_GROUP_BYTES;
#if KVATTN_SIMD == KVA_SIMD_AVX2 || KVATTN_SIMD == KVA_SIMD_AVX512 /* F16C: both in one instruction */
  int32_t h;
  __m128 sm;
  memcpy(&h, g, sizeof h);
  sm = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
  *scale = _mm_cvtss_f32(sm);
  *min = _mm_cvtss_f32(_mm_movehdup_ps(sm));
#elif KVATTN_SIMD == KVA_SIMD_NEON
  uint32_t h;
  float32x4_t sm;
  memcpy(&h, g, sizeof h);
  sm = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(h)));
  *scale = vgetq_lane_f32(sm, 0);
  *min = vgetq_lane_f32(sm, 1);
#else
  uint16_t h[2];
  memcpy(h, g, sizeof h);
  *scale = kva_f16_to_f32(h[0]);
  *min = kva_f16_to_f32(h[1]);
#endif
  return g + KVA__I4_PARAM_BYTES;
}
KVA__FORCEINLINE float kva__load1_i4(const void *row, int i) {
  float s, mn;
  const uint8_t *codes = kva__i4_group(row, i, &s, &mn);
  int c = (codes[(i % KVA__I4_GROUP) / 2] >> (4 * (i & 1))) & 15;
  return (float)c * s + mn; /* (no fused multiply-add: the vector loaders round the same way) */
}

/* Element i of a row as a float, before the row's scale. E4M3 loads as
   value / 256 (its bits shifted into an F16 exponent, as the vector loaders
   do it); the 256 is in its row scale. */
KVA__FORCEINLINE float kva__load1(const kva_dtype t, const void *row, int i) {
  switch (t) {
    case KVA_INT4: return kva__load1_i4(row, i);
    case KVA_F16: return kva_f16_to_f32(((const uint16_t *)row)[i]);
    case KVA_BF16: return kva_bf16_to_f32(((const uint16_t *)row)[i]);
    case KVA_INT8: return (float)((const int8_t *)row)[i];
    case KVA_FP8_E4M3: return kva_e4m3_to_f32(((const uint8_t *)row)[i]) * (1.0f / 256.0f);
    case KVA_FP8_E5M2: return kva_e5m2_to_f32(((const uint8_t *)row)[i]);
    default: return ((const float *)row)[i];
  }
}

/* Whether loaded rows of type t still need a scale (float types skip the
   multiply at compile time). */
KVA__FORCEINLINE int kva__is_scaled(const kva_dtype t) {
  return t == KVA_INT8 || t == KVA_FP8_E4M3 || t == KVA_FP8_E5M2;
}
/* What a loaded row must be multiplied by. INT8 rows carry their own (a
   float just before the codes, so a prefix of the row, such as MLA's V
   inside its latent vector, finds it too); FP8 rows share the tensor scale. */
KVA__FORCEINLINE float kva__row_scale(const kva_dtype t, const void *row, float fp8_scale) {
  float s;
  switch (t) {
    case KVA_INT8: memcpy(&s, (const int8_t *)row - sizeof s, sizeof s); return s;
    case KVA_FP8_E4M3: return fp8_scale * 256.0f;
    case KVA_FP8_E5M2: return fp8_scale;
    default: return 1.0f;
  }
}

/* The next tile's K and V rows, prefetched by the score kernel as it walks
   this tile: one key's rows per key step keep a steady stream of misses in
   flight (issued in one burst, they fill the miss queue and stall the loads
   that compute), and V's arrive a whole tile early. Every tile but the last
   is full, so the next tile never has more rows than this one. */
typedef struct {
  const void *const *k, *const *v;
  int n;
  size_t k_bytes, v_bytes; /* of one row; v_bytes 0: V rows are K rows (latent cache) */
} kva__next_tile;
/* the lines of [p, p + bytes), four per step (the last step may touch up to
   three lines past the end: prefetches never fault, and those lines mostly
   hold the next row) */
KVA__FORCEINLINE void kva__prefetch_span(const void *p, size_t bytes) {
  const char *c = (const char *)p;
  size_t off;
  for (off = 0; off < bytes; off += 256) {
    KVA__PREFETCH(c + off);
    KVA__PREFETCH(c + off + 64);
    KVA__PREFETCH(c + off + 128);
    KVA__PREFETCH(c + off + 192);
  }
}
KVA__FORCEINLINE void kva__prefetch_next(const kva__next_tile *next, int j) {
  if (!next || j >= next->n) return;
  kva__prefetch_span(next->k[j], next->k_bytes);
  kva__prefetch_span(next->v[j], next->v_bytes);
}

/* --- the scalar twins --- */
KVA__FORCEINLINE void kva__dot_tile_scalar(const kva_dtype t, const float *const *q, const int nr,
                                           const void *const *krows, int nk, int d, float *scores, int lds,
                                           float fp8_scale, const kva__next_tile *next) {
  int r, j, i;
  for (j = 0; j < nk; j++) {
    float ks = kva__row_scale(t, krows[j], fp8_scale);
    kva__prefetch_next(next, j);
    for (r = 0; r < nr; r++) {
      float s = 0.0f;
      for (i = 0; i < d; i++) s += q[r][i] * kva__load1(t, krows[j], i);
      scores[r * lds + j] = kva__is_scaled(t) ? s * ks : s;
    }
  }
}
KVA__FORCEINLINE void kva__vacc_tile_scalar(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                            int ldp, const void *const *vrows, int nk, int dv, float fp8_scale) {
  int r, j, i;
  for (j = 0; j < nk; j++) {
    float vs = kva__row_scale(t, vrows[j], fp8_scale);
    for (r = 0; r < nr; r++) {
      float pj = kva__is_scaled(t) ? p[r * ldp + j] * vs : p[r * ldp + j];
      if (pj == 0.0f) continue;
      for (i = 0; i < dv; i++) acc[r][i] += pj * kva__load1(t, vrows[j], i);
    }
  }
}

/* --- many query rows: keys along the lanes ---
   With many rows (prefill, MLA's absorbed heads) a tile's keys are
   dequantized and transposed once, KVA__KT_DEPTH elements at a time, into
   kt[element][key] (f32, KVA__TILE keys per line), and each row's scores
   grow as vectors of keys, one FMA chain per (row, vector of keys) along the
   elements: no reduction tree, and every key vector and broadcast query
   element serves four FMAs. Sums restart at each chunk of KVA__KT_DEPTH
   elements and are added to the chunks before (so a 576-wide MLA key sums
   in 9 chains of 64, not one of 576). Each ISA gives two steps: kt_fill (one
   chunk of the tile, transposed; zeros past nk) and wdot_rows (up to four
   rows' scores over one chunk, added to the earlier chunks' unless `first`,
   times the keys' scales ks (NULL: none) after the last chunk). */
#define KVA__KT_DEPTH 64 /* elements per transposed chunk: kt is KVA__KT_DEPTH x KVA__TILE floats (16 KiB) */
KVA__FORCEINLINE void kva__kt_fill_scalar(const kva_dtype t, const void *const *krows, int nk, int i0, int d,
                                          float *kt) {
  int j, c, nd = d - i0 < KVA__KT_DEPTH ? d - i0 : KVA__KT_DEPTH;
  for (j = 0; j < KVA__TILE; j++) {
    for (c = 0; c < nd; c++) kt[c * KVA__TILE + j] = j < nk ? kva__load1(t, krows[j], i0 + c) : 0.0f;
  }
}
KVA__FORCEINLINE void kva__wdot_rows_scalar(const float *const *q, const int nr, int nk, int i0, int nd,
                                            const float *kt, float *scores, int lds, int first, const float *ks) {
  int r, j, c;
  for (r = 0; r < nr; r++)
    for (j = 0; j < nk; j++) {
      float s = 0.0f;
      for (c = 0; c < nd; c++) s += q[r][i0 + c] * kt[c * KVA__TILE + j];
      if (!first) s = scores[r * lds + j] + s;
      scores[r * lds + j] = ks ? s * ks[j] : s;
    }
}
typedef void (*kva__kt_fill_fn)(const kva_dtype, const void *const *, int, int, int, float *);
typedef void (*kva__wdot_rows_fn)(const float *const *, const int, int, int, int, const float *, float *, int, int,
                                  const float *);
/* The generic loop over chunks and row blocks, specialised per ISA by the
   steps it is given (as xxHash's hashLong loop): scores[r*lds + j] = q_r . k_j
   for r < nr (any count), j < nk; the next tile's rows are prefetched a
   share before each row block (in one burst they stall the loads that
   compute: passes of 24 rows ran at 0.63 of the FMA peak that way, 0.71 spread). */
KVA__FORCEINLINE void kva__wdot_tile_with(const kva_dtype t, const float *const *q, int nr, const void *const *krows,
                                          int nk, int d, float *scores, int lds, float fp8_scale,
                                          const kva__next_tile *next, kva__kt_fill_fn fill, kva__wdot_rows_fn rows) {
  float kt[KVA__KT_DEPTH * KVA__TILE], ks[KVA__TILE];
  int i0, rb, j, step = 0, prefetched = 0;
  const int blocks = (nr + 3) / 4, steps = (d + KVA__KT_DEPTH - 1) / KVA__KT_DEPTH * blocks;
  for (j = 0; j < KVA__TILE; j++) ks[j] = kva__is_scaled(t) && j < nk ? kva__row_scale(t, krows[j], fp8_scale) : 0.0f;
  for (i0 = 0; i0 < d; i0 += KVA__KT_DEPTH) {
    int nd = d - i0 < KVA__KT_DEPTH ? d - i0 : KVA__KT_DEPTH;
    const float *scale = kva__is_scaled(t) && i0 + nd == d ? ks : NULL;
    fill(t, krows, nk, i0, d, kt);
    for (rb = 0; rb < nr; rb += 4, step++) {
      /* the next tile's rows, a share before each row block: a steady stream, not a burst */
      for (; next && prefetched < next->n && prefetched * steps < (step + 1) * next->n; prefetched++)
        kva__prefetch_next(next, prefetched);
      switch (nr - rb) {
        case 1: rows(q + rb, 1, nk, i0, nd, kt, scores + rb * lds, lds, i0 == 0, scale); break;
        case 2: rows(q + rb, 2, nk, i0, nd, kt, scores + rb * lds, lds, i0 == 0, scale); break;
        case 3: rows(q + rb, 3, nk, i0, nd, kt, scores + rb * lds, lds, i0 == 0, scale); break;
        default: rows(q + rb, 4, nk, i0, nd, kt, scores + rb * lds, lds, i0 == 0, scale); break;
      }
    }
  }
}
KVA__FORCEINLINE void kva__wdot_tile_scalar(const kva_dtype t, const float *const *q, int nr,
                                            const void *const *krows, int nk, int d, float *scores, int lds,
                                            float fp8_scale, const kva__next_tile *next) {
  kva__wdot_tile_with(t, q, nr, krows, nk, d, scores, lds, fp8_scale, next, kva__kt_fill_scalar,
                      kva__wdot_rows_scalar);
}

/* --- integer scores (kva_attn.int_scores) ---
   With INT8 or INT4 keys a query row may be quantized to int8 once per call,
   symmetric with one scale per (token, head): scale = amax / 127, code =
   round(q * 127 / amax) half away from zero, both in double. Scores are then
   integer dot products of codes, scaled in float:
     INT8 key:  (float)sum(qc * kc) * (qscale * kscale)
     INT4 key:  qscale * sum over groups (gscale * sum(qc * code) + gmin * sum(qc))
   Every ISA computes the same integers; INT8 scores are identical on every
   ISA, INT4 ones differ in the order of the group sums. */
#define KVA__IQ_MAX_D 16384      /* longer heads keep float scores (one row of codes must fit) */
#define KVA__IQ_STACK_BYTES 32768 /* codes and group sums of a pass's query rows, on the stack */

typedef struct {
  const int8_t *codes;   /* [groups * 32], zero past D; for INT4 keys each group holds its even
                            elements, then its odd ones (the order of a code byte's two nibbles) */
  const int32_t *gsum;   /* [groups] the sum of each group's codes */
  int32_t full_sum;      /* the sum of the codes of the whole groups (a correction for VNNI) */
  float scale;           /* NaN when the row holds a NaN or an infinity: its scores are NaN */
} kva__qrow;

KVA__FORCEINLINE int kva__int_scored(kva_dtype kt) { return kt == KVA_INT8 || kt == KVA_INT4; }
/* Bytes of one quantized query row of d values (codes, then group sums). */
static inline size_t kva__qrow_bytes(int d) {
  size_t groups = ((size_t)d + 31) / 32;
  return groups * 32 + groups * sizeof(int32_t);
}

/* Quantize q[0..d) into mem (kva__qrow_bytes(d) bytes, int32-aligned) for keys of type kt. */
static inline void kva__quantize_query(const float *q, int d, kva_dtype kt, void *mem, kva__qrow *out) {
  int groups = (d + 31) / 32, i;
  int32_t *gsum = (int32_t *)mem;
  int8_t *codes = (int8_t *)(gsum + groups);
  float amax = 0.0f;
  int finite = 1;
  double mul;
  for (i = 0; i < d; i++) {
    float a = fabsf(q[i]);
    if (!(a <= FLT_MAX)) finite = 0; /* NaN or infinity */
    else if (a > amax) amax = a;
  }
  memset(codes, 0, (size_t)groups * 32);
  memset(gsum, 0, (size_t)groups * sizeof(int32_t));
  out->codes = codes, out->gsum = gsum, out->full_sum = 0;
  if (!finite) {
    out->scale = NAN;
    return;
  }
  out->scale = (float)((double)amax / 127.0);
  mul = amax > 0.0f ? 127.0 / (double)amax : 0.0;
  for (i = 0; i < d; i++) {
    double x = (double)q[i] * mul;
    int c = (int)(x < 0.0 ? x - 0.5 : x + 0.5), e = i % 32;
    if (c > 127) c = 127;
    if (c < -127) c = -127;
    codes[i - e + (kt == KVA_INT4 ? (e & 1) * 16 + e / 2 : e)] = (int8_t)c;
    gsum[i / 32] += c;
    if (i < d / 32 * 32) out->full_sum += c;
  }
}

/* sum(qc * kc) of INT8 codes [i0, d) */
KVA__FORCEINLINE int32_t kva__idot_i8_rest(const int8_t *qc, const int8_t *kc, int i0, int d) {
  int32_t s = 0;
  int i;
  for (i = i0; i < d; i++) s += (int32_t)qc[i] * (int32_t)kc[i];
  return s;
}
/* sum(qc * code) of one INT4 group of m values (codes: its 16 code bytes; qc: the query's group) */
KVA__FORCEINLINE int32_t kva__idot_i4_group(const int8_t *qc, const uint8_t *codes, int m) {
  int32_t s = 0;
  int e;
  for (e = 0; e + 1 < m; e += 2) s += qc[e / 2] * (codes[e / 2] & 15) + qc[16 + e / 2] * (codes[e / 2] >> 4);
  if (e < m) s += qc[e / 2] * (codes[e / 2] & 15);
  return s;
}
/* INT4 groups [g0, groups) of one score, one after another: gscale * dot + gmin * gsum each */
KVA__FORCEINLINE float kva__idot_i4_rest(const kva__qrow *q, const void *krow, int g0, int d) {
  float s = 0.0f;
  int g;
  for (g = g0; g * 32 < d; g++) {
    float gs, gmin;
    const uint8_t *codes = kva__i4_group(krow, g * 32, &gs, &gmin);
    int m = d - g * 32 < 32 ? d - g * 32 : 32;
    s += gs * (float)kva__idot_i4_group(q->codes + g * 32, codes, m) + gmin * (float)q->gsum[g];
  }
  return s;
}

KVA__FORCEINLINE void kva__idot_tile_scalar(const kva_dtype t, const kva__qrow *q, const int nr,
                                            const void *const *krows, int nk, int d, float *scores, int lds,
                                            const kva__next_tile *next) {
  int r, j;
  for (j = 0; j < nk; j++) {
    kva__prefetch_next(next, j);
    for (r = 0; r < nr; r++) {
      if (t == KVA_INT8)
        scores[r * lds + j] = (float)kva__idot_i8_rest(q[r].codes, (const int8_t *)krows[j], 0, d) *
                              (q[r].scale * kva__row_scale(KVA_INT8, krows[j], 1.0f));
      else
        scores[r * lds + j] = q[r].scale * kva__idot_i4_rest(&q[r], krows[j], 0, d);
    }
  }
}

/* --- integer values (kva_attn.int_values) ---
   Over INT8 or INT4 values, each query row's probabilities in a tile of
   keys become unsigned 8-bit codes with the token's scale folded in, and
   the products over keys are integer dot products (docs/API.md, "Integer
   values"). For a row with probabilities p_j (exp(score - running max), as
   the float path has them) over the keys j of a tile:
     INT8 (token j: codes v_j, scale s_j):  w_j = p_j * s_j,  W = max_j w_j,
       u_j = round(255 * w_j / W),  acc += (W / 255) * sum_j u_j * v_j
     INT4 (token j, group g of 32 channels: codes c_j, scale s_jg, minimum m_jg):
       w_jg = p_j * s_jg,  W_g = max_j w_jg,  u_jg = round(255 * w_jg / W_g),
       acc (group g) += (W_g / 255) * sum_j u_jg * c_j + sum_j p_j * m_jg
   round() is half up, in float. A code is within half a step of its
   weight, so each token's weight is off by at most W / 510. The sums are
   exact integers on every ISA (u8 x s8 products, at most 255 * 128 * 64
   per tile: exact in float too).
   The kernels step over KVA__IV_CH channels at a time (one INT4 group),
   four keys at a time: each ISA first interleaves four keys' codes so that
   a channel's four sit together (kva__ilv4_<isa>: the layout is the ISA's
   own, read only by its kva__iprod_<isa>), then adds the products of one
   row's four probability codes with them into that channel's 32-bit sum. */
#define KVA__IV_CH 32
#define KVA__IV_BYTES (4 * KVA__IV_CH) /* four keys of one step, interleaved */

/* four keys' probability codes as one 32-bit word, for a broadcast */
KVA__FORCEINLINE int32_t kva__iv_u4(const uint8_t *u) {
  int32_t v;
  memcpy(&v, u, sizeof v);
  return v;
}
/* The four keys' codes of one step (rows[k]: the first code byte of the
   step in key k's row; INT4 codes expand to a byte each), channel c's four
   at dst[4c .. 4c + 3]. */
static inline void kva__ilv4_scalar(uint8_t *dst, const uint8_t *const *rows, int i4) {
  int c, k;
  for (c = 0; c < KVA__IV_CH; c++)
    for (k = 0; k < 4; k++) dst[4 * c + k] = i4 ? (uint8_t)((rows[k][c / 2] >> (4 * (c & 1))) & 15) : rows[k][c];
}
/* out[r * KVA__IV_CH + c] = sum_j u[r * ldu + j] * x_jc (r < nr, j < nk4, a
   multiple of 4) over the interleaved codes x (signed for INT8, 0..15 for
   INT4), as floats. */
KVA__FORCEINLINE void kva__iprod_scalar(float *out, const uint8_t *ilv, int nk4, const uint8_t *u, int ldu,
                                        const int nr, const int i4) {
  int r, c, j;
  for (r = 0; r < nr; r++)
    for (c = 0; c < KVA__IV_CH; c++) {
      int32_t s = 0;
      for (j = 0; j < nk4; j++) {
        int x = ilv[(j / 4) * KVA__IV_BYTES + 4 * c + j % 4];
        s += (int32_t)u[r * ldu + j] * (i4 ? x : (int)(int8_t)x);
      }
      out[r * KVA__IV_CH + c] = (float)s;
    }
}

/* The SIMD value kernels fold each row's scale into its probabilities first:
   returns the probabilities to use (buf, KVA__NR x KVA__TILE, with *ldp set
   to its stride, or p itself for float types). */
KVA__FORCEINLINE const float *kva__scale_probs(const kva_dtype t, const float *p, int *ldp, int nr,
                                               const void *const *vrows, int nk, float fp8_scale, float *buf) {
  int r, j;
  if (!kva__is_scaled(t)) return p;
  for (j = 0; j < nk; j++) {
    float vs = kva__row_scale(t, vrows[j], fp8_scale);
    for (r = 0; r < nr; r++) buf[r * KVA__TILE + j] = p[r * *ldp + j] * vs;
  }
  *ldp = KVA__TILE;
  return buf;
}

/* x[i] = exp(x[i] - m), returning their sum; -inf gives exactly 0 */
static inline float kva__exp_sub_sum_scalar(float *x, int n, float m) {
  float sum = 0.0f;
  int i;
  for (i = 0; i < n; i++) sum += x[i] = expf(x[i] - m);
  return sum;
}

/* x[i] *= scale, returning the largest */
static inline float kva__scale_max_scalar(float *x, int n, float scale) {
  float mx = -INFINITY;
  int i;
  for (i = 0; i < n; i++) {
    x[i] *= scale;
    if (x[i] > mx) mx = x[i];
  }
  return mx;
}

/* The score bounds of a block (kva_attn.select_budget) for nr (<= 4) query
   rows q[r]: bound[r] = the sum over the d channels of max(q_i * lo_i,
   q_i * hi_i), lohi = d F16 minimums then d F16 maximums. Products and
   their maxima as written; the vector kernels sum in their lanes, then
   across them. */
/* channels i0 .. d-1 added to bound[] (the vector kernels' tails too) */
static inline void kva__block_bound_from(const float *const *q, int nr, const uint16_t *lohi, int d, int i0,
                                         float *bound) {
  int i, r;
  for (i = i0; i < d; i++) {
    const float lo = kva_f16_to_f32(lohi[i]), hi = kva_f16_to_f32(lohi[d + i]);
    for (r = 0; r < nr; r++) {
      float a = q[r][i] * lo, b = q[r][i] * hi;
      bound[r] += a > b ? a : b;
    }
  }
}
static inline void kva__block_bound_scalar(const float *const *q, int nr, const uint16_t *lohi, int d, float *bound) {
  int r;
  for (r = 0; r < nr; r++) bound[r] = 0.0f;
  kva__block_bound_from(q, nr, lohi, d, 0, bound);
}

/* a . b over n floats */
static inline float kva__dot_f32_scalar(const float *a, const float *b, int n) {
  float s = 0.0f;
  int i;
  for (i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static inline void kva__f32_to_f16_row_scalar(uint16_t *dst, const float *src, int n) {
  int i;
  for (i = 0; i < n; i++) dst[i] = kva_f32_to_f16(src[i]);
}

/* dst[i] = fp8(src[i] * mul) */
static inline void kva__fp8_encode_scalar(uint8_t *dst, const float *src, size_t n, float mul,
                                          const kva__fp8_format *f) {
  size_t i;
  for (i = 0; i < n; i++) dst[i] = f->e5m2 ? kva_f32_to_e5m2(src[i] * mul) : kva_f32_to_e4m3(src[i] * mul);
}

/* One INT4 group's codes (see kva__quantize_i4; codes zeroed before): code =
   round((x - mn) / scale) in 0..15, two per byte, the lower element in the
   low nibble. Divided, not multiplied by a reciprocal, so that a value
   half-way between two codes rounds up as the rule says; a constant group
   (scale 0) keeps +Inf at the top code. */
static inline void kva__i4_encode_scalar(uint8_t *codes, const float *src, int m, float mn, float scale) {
  int i;
  for (i = 0; i < m; i++) {
    double x = (double)src[i], v = scale > 0.0f ? (x - (double)mn) / (double)scale : x == (double)INFINITY ? 15.0 : 0.0;
    int c;
    if (!(v == v)) v = 0.0;
    c = v >= 15.0 ? 15 : v <= 0.0 ? 0 : (int)(v + 0.5);
    codes[i / 2] = (uint8_t)(codes[i / 2] | c << (4 * (i & 1)));
  }
}

/* --- rotation (kva_cache_desc.rotate): the fast Walsh-Hadamard transform --- */
/* x (n a power of two) times the Hadamard matrix scaled by 1/sqrt(n): the
   butterflies (a, b) -> (a + b, a - b) at distances 1, 2, 4, ..., then the
   scale. Every butterfly is the same two float operations whatever the
   order, so the vector version below gives these bits. */
static inline void kva__fwht_scalar(float *x, int n) {
  float s = (float)(1.0 / sqrt((double)n));
  int h, i, j;
  for (h = 1; h < n; h *= 2)
    for (i = 0; i < n; i += 2 * h)
      for (j = i; j < i + h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  for (i = 0; i < n; i++) x[i] *= s;
}


/* --- the vector mapping: loops written once for every ISA ---
   exp_sub_sum, scale_max and the value kernel's strip are written once,
   below, as ggml writes its vector loops over simd-mappings.h: over a few
   names each ISA defines with its prefix V (KVA__AVX2_, KVA__AVX512_,
   KVA__NEON_; a new ISA defines the same set). Each ISA's block spells out
   its functions, `... kva__exp_sub_sum_avx2(...) { KVA__EXP_SUB_SUM(KVA__AVX2_) }`,
   which compile to the instructions of a loop written for that ISA. (Macros,
   not an inline function taking the steps: the vector types differ, and an
   AVX-512 build compiles the AVX2 kernels too.)
     F, N                 the float vector and its lanes
     MORE(i, n)           whether a vector step starts at element i of n
     MASK, LANES(i, n)    the lanes of the step at i below n: AVX-512's masks;
                          an ISA without them steps over whole vectors only
                          (an int, ignored) and leaves the rest to a scalar tail
     LOAD(m, p), STORE(p, m, v)   the lanes m selects (the others load as 0)
     ROW(t, row, i, m)    elements i.. of a row in storage type t, as floats
     ZERO, SET1(x)        zero, a broadcast
     ADD SUB MUL MIN MAX(a, b)   FMA(a, b, c) = a * b + c, FNMA(a, b, c) = c - a * b
     MAX_IN(mx, v, m)     max(mx, v) in the lanes of m, mx in the others
     HSUM(v), HMAX(v)     the sum and the largest of the lanes
     ROUND(v)             to the nearest integer, ties to even
     POW2(p, t)           p * 2^t for whole t: t added to p's exponent bits
     KEEP_T, KEEP(v, lo, m), KEEP_ONLY(k, p)   p in the lanes of m where v >= lo, 0 elsewhere
     S_T, S(p, k), S_ZERO, FMA_S(a, v, s)   p[k] as a multiplier
                          (a broadcast, or on NEON the float itself), a + v * s */

/* The Walsh-Hadamard transform's butterflies at distances of a whole vector and more, then the
   scale s: the part every ISA shares (the distances inside a vector are each ISA's own). Runs
   in kva__fwht_<isa>(x, n) over its x, n, s and its ints h, i, j. */
#define KVA__FWHT_WIDE(V)                                                \
  for (h = V##N; h < n; h *= 2)                                          \
    for (i = 0; i < n; i += 2 * h)                                       \
      for (j = i; j < i + h; j += V##N) {                                \
        V##F a = V##LOAD(0, x + j), b = V##LOAD(0, x + j + h);           \
        V##STORE(x + j, 0, V##ADD(a, b));                                \
        V##STORE(x + j + h, 0, V##SUB(a, b));                            \
      }                                                                  \
  for (i = 0; i < n; i += V##N) V##STORE(x + i, 0, V##MUL(V##LOAD(0, x + i), s))

/* kva__exp_sub_sum_<isa>(x, n, m): x[i] = exp(x[i] - m), returning their sum.
   exp by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial:
   relative error ~2e-7 against expf; inputs below -86.5 (incl. -inf) give 0
   (e^-86.5 is 3e-38: nothing a softmax can see). */
#define KVA__EXP_SUB_SUM(V)                                                                     \
  const V##F log2e = V##SET1(1.44269504088896341f);                                             \
  const V##F ln2_hi = V##SET1(0.693359375f), ln2_lo = V##SET1(-2.12194440e-4f);                 \
  const V##F lo = V##SET1(-86.5f), hi = V##SET1(88.3f);                                         \
  const V##F c1 = V##SET1(1.0f), c2 = V##SET1(0.5f);                                            \
  const V##F c3 = V##SET1(1.6666665459e-1f), c4 = V##SET1(4.1665795894e-2f);                    \
  const V##F c5 = V##SET1(8.3334519073e-3f), c6 = V##SET1(1.3981999507e-3f);                    \
  const V##F c7 = V##SET1(1.9875691500e-4f), mv = V##SET1(m);                                   \
  V##F acc = V##ZERO;                                                                           \
  float sum;                                                                                    \
  int i;                                                                                        \
  for (i = 0; V##MORE(i, n); i += V##N) {                                                       \
    const V##MASK lanes = V##LANES(i, n);                                                       \
    V##F v = V##SUB(V##LOAD(lanes, x + i), mv), t, r, r2, poly;                                 \
    const V##KEEP_T keep = V##KEEP(v, lo, lanes);                                               \
    v = V##MIN(V##MAX(v, lo), hi);                                                              \
    t = V##ROUND(V##MUL(v, log2e));                                                             \
    r = V##FNMA(t, ln2_hi, v);                                                                  \
    r = V##FNMA(t, ln2_lo, r);                                                                  \
    r2 = V##MUL(r, r);                                                                          \
    poly = V##FMA(c7, r, c6);                                                                   \
    poly = V##FMA(poly, r, c5);                                                                 \
    poly = V##FMA(poly, r, c4);                                                                 \
    poly = V##FMA(poly, r, c3);                                                                 \
    poly = V##FMA(poly, r, c2);                                                                 \
    poly = V##FMA(poly, r2, V##ADD(r, c1));                                                     \
    poly = V##KEEP_ONLY(keep, V##POW2(poly, t));                                                \
    V##STORE(x + i, lanes, poly);                                                               \
    acc = V##ADD(acc, poly);                                                                    \
  }                                                                                             \
  sum = V##HSUM(acc);                                                                           \
  for (; i < n; i++) sum += x[i] = expf(x[i] - m);                                              \
  return sum;

/* kva__block_bound_<isa>(q, nr, lohi, d, bound): as kva__block_bound_scalar,
   the F16 bounds through the F16 row loader, once for the nr rows */
#define KVA__BOUND_ROW(V, r)                                                                    \
  if (nr > r) acc##r = V##ADD(acc##r, V##MAX(V##MUL(V##LOAD(lanes, q##r + i), lo),             \
                                            V##MUL(V##LOAD(lanes, q##r + i), hi)));
#define KVA__BLOCK_BOUND(V)                                                                     \
  const float *q0 = q[0], *q1 = q[nr > 1 ? 1 : 0], *q2 = q[nr > 2 ? 2 : 0], *q3 = q[nr > 3 ? 3 : 0]; \
  V##F acc0 = V##ZERO, acc1 = acc0, acc2 = acc0, acc3 = acc0;                                   \
  int i;                                                                                        \
  for (i = 0; V##MORE(i, d); i += V##N) {                                                       \
    const V##MASK lanes = V##LANES(i, d);                                                       \
    const V##F lo = V##ROW(KVA_F16, lohi, i, lanes), hi = V##ROW(KVA_F16, lohi + d, i, lanes); \
    KVA__BOUND_ROW(V, 0) KVA__BOUND_ROW(V, 1) KVA__BOUND_ROW(V, 2) KVA__BOUND_ROW(V, 3)         \
  }                                                                                             \
  bound[0] = V##HSUM(acc0);                                                                     \
  if (nr > 1) bound[1] = V##HSUM(acc1);                                                         \
  if (nr > 2) bound[2] = V##HSUM(acc2);                                                         \
  if (nr > 3) bound[3] = V##HSUM(acc3);                                                         \
  kva__block_bound_from(q, nr, lohi, d, i, bound);

/* kva__scale_max_<isa>(x, n, scale): x[i] *= scale, returning the largest */
#define KVA__SCALE_MAX(V)                                                                       \
  const V##F sv = V##SET1(scale);                                                               \
  V##F mx = V##SET1(-INFINITY);                                                                 \
  float r;                                                                                      \
  int i;                                                                                        \
  for (i = 0; V##MORE(i, n); i += V##N) {                                                       \
    const V##MASK lanes = V##LANES(i, n);                                                       \
    V##F v = V##MUL(V##LOAD(lanes, x + i), sv);                                                 \
    V##STORE(x + i, lanes, v);                                                                  \
    mx = V##MAX_IN(mx, v, lanes);                                                               \
  }                                                                                             \
  r = V##HMAX(mx);                                                                              \
  for (; i < n; i++) {                                                                          \
    x[i] *= scale;                                                                              \
    if (x[i] > r) r = x[i];                                                                     \
  }                                                                                             \
  return r;

/* kva__vacc_strip_<isa>(t, acc, nr, p, ldp, vrows, nk, i, nv, dv): the value
   kernel over one strip of nv (<= 4) vectors of columns from column i (of
   dv), nr (<= 4) rows: acc_r += sum_j p[r*ldp + j] * v_j, in the 16
   accumulators a<row><vector> (KVA__EACH_4X4_OF), so that they stay in registers.
   Vectors load in pairs (V##ROW_PAIR: the second only when `both`), which
   lie in one INT4 group, so that its F16 scale and minimum convert once. */
#define KVA__VACC_INIT(V, r, c) V##F a##r##c = nr > r && nv > c ? V##LOAD(m##c, acc[r] + i + V##N * c) : z;
#define KVA__VACC_FMA(V, r, c) if (nr > r && nv > c) a##r##c = V##FMA_S(a##r##c, v##c, p##r);
#define KVA__VACC_STORE(V, r, c) if (nr > r && nv > c) V##STORE(acc[r] + i + V##N * c, m##c, a##r##c);
#define KVA__VACC_STRIP(V)                                                                      \
  const V##F z = V##ZERO;                                                                       \
  const V##MASK m0 = V##LANES(i, dv), m1 = V##LANES(i + V##N, dv);                              \
  const V##MASK m2 = V##LANES(i + 2 * V##N, dv), m3 = V##LANES(i + 3 * V##N, dv);               \
  int j;                                                                                        \
  KVA__EACH_4X4_OF(KVA__VACC_INIT, V)                                                           \
  for (j = 0; j < nk; j++) {                                                                    \
    const void *vr = vrows[j];                                                                  \
    V##F v0, v1, v2 = z, v3 = z;                                                                \
    V##ROW_PAIR(t, vr, i, m0, m1, nv > 1, v0, v1);                                              \
    if (nv > 2) V##ROW_PAIR(t, vr, i + 2 * V##N, m2, m3, nv > 3, v2, v3);                       \
    V##S_T p0 = V##S(p, j);                                                                     \
    V##S_T p1 = nr > 1 ? V##S(p, ldp + j) : V##S_ZERO;                                          \
    V##S_T p2 = nr > 2 ? V##S(p, 2 * ldp + j) : V##S_ZERO;                                      \
    V##S_T p3 = nr > 3 ? V##S(p, 3 * ldp + j) : V##S_ZERO;                                      \
    KVA__EACH_4X4_OF(KVA__VACC_FMA, V)                                                          \
  }                                                                                             \
  KVA__EACH_4X4_OF(KVA__VACC_STORE, V)

#if KVATTN_SIMD == KVA_SIMD_AVX2 || KVATTN_SIMD == KVA_SIMD_AVX512
/* --- AVX2 + FMA + F16C (also compiled under AVX-512, which reuses its
   conversions and dot product) --- */

/* 8 INT4 values from 4 code bytes (bytes 0-3 of b): byte k's nibbles go to lanes 2k, 2k+1, as
   code * scale + min */
KVA__FORCEINLINE __m256 kva__i4_values8_avx2(__m128i b, __m256 scale, __m256 min) {
  __m256i c = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0)));
  c = _mm256_and_si256(_mm256_srlv_epi32(c, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), _mm256_set1_epi32(15));
  return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), scale), min);
}
/* 8 INT4 elements from i (a multiple of 8) */
KVA__FORCEINLINE __m256 kva__load8_i4_avx2(const void *row, int i) {
  float s, mn;
  const uint8_t *codes = kva__i4_group(row, i, &s, &mn) + (i % KVA__I4_GROUP) / 2;
  uint32_t w;
  memcpy(&w, codes, 4);
  return kva__i4_values8_avx2(_mm_cvtsi32_si128((int)w), _mm256_set1_ps(s), _mm256_set1_ps(mn));
}
/* 16 INT4 elements from i (a multiple of 16) as two vectors, one group's
   scale and minimum converted once */
KVA__FORCEINLINE void kva__load16_i4_avx2(const void *row, int i, __m256 *lo, __m256 *hi) {
  float s, mn;
  const uint8_t *codes = kva__i4_group(row, i, &s, &mn) + (i % KVA__I4_GROUP) / 2;
  const __m256 sv = _mm256_set1_ps(s), mv = _mm256_set1_ps(mn);
  const __m128i b = _mm_loadl_epi64((const __m128i *)codes);
  *lo = kva__i4_values8_avx2(b, sv, mv);
  *hi = kva__i4_values8_avx2(_mm_srli_si128(b, 4), sv, mv);
}

/* 8 elements of a row from element i. E5M2 is an F16's top byte; E4M3 bits
   shifted into an F16 give value / 256. */
KVA__FORCEINLINE __m256 kva__load8_avx2(const kva_dtype t, const void *row, int i) {
  const uint8_t *b = (const uint8_t *)row + i;
  switch (t) {
    case KVA_INT4: return kva__load8_i4_avx2(row, i);
    case KVA_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    case KVA_BF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
    case KVA_INT8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)b)));
    case KVA_FP8_E5M2: return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)b)), 8));
    case KVA_FP8_E4M3: {
      /* sign-extended to 16 bits and shifted by 7, a code's sign lands in
         bit 15 and also in bit 14, the F16 exponent's top bit, which must be clear */
      __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)b));
      return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(x, 7), _mm_set1_epi16((short)0xbf80)));
    }
    default: return _mm256_loadu_ps((const float *)row + i);
  }
}

/* sum of each of 4 vectors: [s(a0), s(a1), s(a2), s(a3)] */
KVA__FORCEINLINE __m128 kva__hsum4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* the vector mapping (see KVA__EXP_SUB_SUM): whole vectors of 8, a scalar tail */
#define KVA__AVX2_F __m256
#define KVA__AVX2_N 8
#define KVA__AVX2_MORE(i, n) ((i) + 8 <= (n))
#define KVA__AVX2_MASK int
#define KVA__AVX2_LANES(i, n) ((void)(n), 0)
#define KVA__AVX2_LOAD(m, p) ((void)(m), _mm256_loadu_ps(p))
#define KVA__AVX2_STORE(p, m, v) ((void)(m), _mm256_storeu_ps(p, v))
#define KVA__AVX2_ROW(t, row, i, m) ((void)(m), kva__load8_avx2(t, row, i))
#define KVA__AVX2_ROW_PAIR(t, row, i, ma, mb, both, va, vb)              \
  do {                                                                 \
    (void)(ma), (void)(mb);                                            \
    if ((t) == KVA_INT4 && (both)) {                                   \
      kva__load16_i4_avx2(row, i, &(va), &(vb));                       \
    } else {                                                           \
      (va) = kva__load8_avx2(t, row, i);                               \
      if (both) (vb) = kva__load8_avx2(t, row, (i) + 8);               \
      else (vb) = _mm256_setzero_ps();                                 \
    }                                                                  \
  } while (0)
#define KVA__AVX2_ZERO _mm256_setzero_ps()
#define KVA__AVX2_SET1(x) _mm256_set1_ps(x)
#define KVA__AVX2_ADD(a, b) _mm256_add_ps(a, b)
#define KVA__AVX2_SUB(a, b) _mm256_sub_ps(a, b)
#define KVA__AVX2_MUL(a, b) _mm256_mul_ps(a, b)
#define KVA__AVX2_MIN(a, b) _mm256_min_ps(a, b)
#define KVA__AVX2_MAX(a, b) _mm256_max_ps(a, b)
#define KVA__AVX2_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KVA__AVX2_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define KVA__AVX2_MAX_IN(mx, v, m) _mm256_max_ps(mx, v)
#define KVA__AVX2_HSUM(v) kva__hsum_avx2(v)
#define KVA__AVX2_HMAX(v) kva__hmax_avx2(v)
#define KVA__AVX2_ROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define KVA__AVX2_POW2(p, t) \
  _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(t), 23)))
#define KVA__AVX2_KEEP_T __m256 /* the lanes below lo, all bits set */
#define KVA__AVX2_KEEP(v, lo, m) _mm256_cmp_ps(v, lo, _CMP_LT_OQ)
#define KVA__AVX2_KEEP_ONLY(k, p) _mm256_andnot_ps(k, p)
#define KVA__AVX2_S_T __m256
#define KVA__AVX2_S(p, k) _mm256_broadcast_ss(p + k) /* p + ldp + j: gcc's best addressing here */
#define KVA__AVX2_S_ZERO _mm256_setzero_ps()
#define KVA__AVX2_FMA_S(a, v, s) _mm256_fmadd_ps(s, v, a)

/* the sum and the largest of 8 lanes */
KVA__FORCEINLINE float kva__hsum_avx2(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
KVA__FORCEINLINE float kva__hmax_avx2(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* Scores: two keys per step, each q load serving both (8 FMA chains). */
KVA__FORCEINLINE void kva__dot_tile_avx2(const kva_dtype t, const float *const *q, const int nr,
                                         const void *const *krows, int nk, int d, float *scores, int lds,
                                         float fp8_scale, const kva__next_tile *next) {
  const __m256 z = _mm256_setzero_ps();
  const float *qr[4];
  int j, i, r;
  for (r = 0; r < 4; r++) qr[r] = q[nr > r ? r : 0];
  for (j = 0; j < nk; j += 2) { /* past the end, k1 repeats k0; not stored */
    const void *k0 = krows[j], *k1 = krows[j + 1 < nk ? j + 1 : j];
    __m256 a00 = z, a10 = z, a20 = z, a30 = z, a01 = z, a11 = z, a21 = z, a31 = z;
    float KVA__ALIGN(16) s0[4], s1[4];
    kva__prefetch_next(next, j);
    kva__prefetch_next(next, j + 1);
    for (i = 0; i + 8 <= d; i += 8) {
      __m256 x0 = kva__load8_avx2(t, k0, i), x1 = kva__load8_avx2(t, k1, i), qv;
      qv = _mm256_loadu_ps(qr[0] + i);
      a00 = _mm256_fmadd_ps(qv, x0, a00);
      a01 = _mm256_fmadd_ps(qv, x1, a01);
      if (nr > 1) {
        qv = _mm256_loadu_ps(qr[1] + i);
        a10 = _mm256_fmadd_ps(qv, x0, a10);
        a11 = _mm256_fmadd_ps(qv, x1, a11);
      }
      if (nr > 2) {
        qv = _mm256_loadu_ps(qr[2] + i);
        a20 = _mm256_fmadd_ps(qv, x0, a20);
        a21 = _mm256_fmadd_ps(qv, x1, a21);
      }
      if (nr > 3) {
        qv = _mm256_loadu_ps(qr[3] + i);
        a30 = _mm256_fmadd_ps(qv, x0, a30);
        a31 = _mm256_fmadd_ps(qv, x1, a31);
      }
    }
    _mm_store_ps(s0, kva__hsum4_avx2(a00, a10, a20, a30));
    _mm_store_ps(s1, kva__hsum4_avx2(a01, a11, a21, a31));
    for (; i < d; i++) {
      float kf0 = kva__load1(t, k0, i), kf1 = kva__load1(t, k1, i);
      for (r = 0; r < nr; r++) {
        s0[r] += qr[r][i] * kf0;
        s1[r] += qr[r][i] * kf1;
      }
    }
    if (kva__is_scaled(t)) {
      float ks0 = kva__row_scale(t, k0, fp8_scale), ks1 = kva__row_scale(t, k1, fp8_scale);
      for (r = 0; r < nr; r++) {
        s0[r] *= ks0;
        s1[r] *= ks1;
      }
    }
    for (r = 0; r < nr; r++) scores[r * lds + j] = s0[r];
    if (j + 1 < nk)
      for (r = 0; r < nr; r++) scores[r * lds + j + 1] = s1[r];
  }
}

/* one strip of nv (<= 4) vectors of 8 columns from column i, nr rows */
KVA__FORCEINLINE void kva__vacc_strip_avx2(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                           int ldp, const void *const *vrows, int nk, int i, const int nv, int dv) {
  KVA__VACC_STRIP(KVA__AVX2_)
}
KVA__FORCEINLINE void kva__vacc_tile_avx2(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                          int ldp, const void *const *vrows, int nk, int dv, float fp8_scale) {
  float pbuf[KVA__NR * KVA__TILE];
  int i, j, r;
  p = kva__scale_probs(t, p, &ldp, nr, vrows, nk, fp8_scale, pbuf);
  /* 16 ymm registers: strips of 2 vectors (8 accumulators, 2 values, 4 broadcasts) */
  for (i = 0; i + 16 <= dv; i += 16) kva__vacc_strip_avx2(t, acc, nr, p, ldp, vrows, nk, i, 2, dv);
  if (dv - i >= 8) {
    kva__vacc_strip_avx2(t, acc, nr, p, ldp, vrows, nk, i, 1, dv);
    i += 8;
  }
  for (; i < dv; i++)
    for (j = 0; j < nk; j++) {
      float vf = kva__load1(t, vrows[j], i);
      for (r = 0; r < nr; r++) acc[r][i] += p[r * ldp + j] * vf;
    }
}

static inline float kva__exp_sub_sum_avx2(float *x, int n, float m) { KVA__EXP_SUB_SUM(KVA__AVX2_) }
static inline float kva__scale_max_avx2(float *x, int n, float scale) { KVA__SCALE_MAX(KVA__AVX2_) }
static inline void kva__block_bound_avx2(const float *const *q, int nr, const uint16_t *lohi, int d, float *bound) {
  KVA__BLOCK_BOUND(KVA__AVX2_)
}

static inline float kva__dot_f32_avx2(const float *a, const float *b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  float t;
  int i;
  for (i = 0; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  t = kva__hsum_avx2(_mm256_add_ps(s0, s1));
  for (; i < n; i++) t += a[i] * b[i];
  return t;
}

static inline void kva__f32_to_f16_row_avx2(uint16_t *dst, const float *src, int n) {
  int i;
  for (i = 0; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) dst[i] = kva_f32_to_f16(src[i]);
}

/* 8 codes per step, bit-identical to the scalar encoder (see kva__fp8_format) */
static inline void kva__fp8_encode_avx2(uint8_t *dst, const float *src, size_t n, float mul,
                                        const kva__fp8_format *f) {
  const __m256 mv = _mm256_set1_ps(mul), magic = _mm256_castsi256_ps(_mm256_set1_epi32((int)f->magic));
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i min_normal = _mm256_set1_epi32((int)f->min_normal), one = _mm256_set1_epi32(1);
  const __m256i round = _mm256_set1_epi32((1 << (f->shift - 1)) - 1), rebias = _mm256_set1_epi32((int)f->rebias);
  const __m256i max_code = _mm256_set1_epi32((int)f->max_code), nan_code = _mm256_set1_epi32((int)f->nan_code);
  const __m256i sign_byte = _mm256_set1_epi32(0x80);
  const __m128i sh = _mm_cvtsi32_si128(f->shift);
  const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  size_t i;
  for (i = 0; i + 8 <= n; i += 8) {
    __m256i x = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(src + i), mv));
    __m256i a = _mm256_and_si256(x, abs_mask), code, sub, norm, p;
    uint32_t lo, hi;
    sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), magic)), _mm256_castps_si256(magic));
    norm = _mm256_add_epi32(_mm256_add_epi32(a, round), _mm256_and_si256(_mm256_srl_epi32(a, sh), one));
    norm = _mm256_min_epu32(_mm256_srl_epi32(_mm256_sub_epi32(norm, rebias), sh), max_code);
    code = _mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(min_normal, a));
    code = _mm256_blendv_epi8(code, nan_code, _mm256_cmpgt_epi32(a, inf));
    code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(x, 24), sign_byte));
    p = _mm256_shuffle_epi8(code, gather);
    lo = (uint32_t)_mm256_cvtsi256_si32(p);
    hi = (uint32_t)_mm256_extract_epi32(p, 4);
    memcpy(dst + i, &lo, 4);
    memcpy(dst + i + 4, &hi, 4);
  }
  kva__fp8_encode_scalar(dst + i, src + i, n - i, mul, f);
}
/* --- integer scores: 32 codes per step. With VNNI (AVX512-VNNI + VL, or
   AVX-VNNI) one vpdpbusd takes unsigned bytes times signed bytes into 32-bit
   sums; without, maddubs + madd do the same, exactly while each pair's sum
   of products fits 16 bits (ours stay within 2 * 127 * 128). --- */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVA__VNNI 1
#define KVA__DPBUSD256(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define KVA__VNNI 1
#define KVA__DPBUSD256(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define KVA__VNNI 0
#define KVA__DPBUSD256(acc, u, s) \
  _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#endif

/* acc + sum(q * k) of 32 signed INT8 codes, per lane. VNNI: k + 128 is
   unsigned, and the 128 * sum(q) it adds is taken off once per score (full_sum);
   without: |q| is unsigned and k takes q's sign. */
KVA__FORCEINLINE __m256i kva__idot32_i8_avx2(__m256i acc, __m256i k_biased, __m256i k, __m256i q) {
#if KVA__VNNI
  (void)k;
  return KVA__DPBUSD256(acc, k_biased, q);
#else
  (void)k_biased;
  return KVA__DPBUSD256(acc, _mm256_abs_epi8(q), _mm256_sign_epi8(k, q));
#endif
}
/* The sums of eight vectors, a[r] for key 0 then b[r] for key 1 (r < 4):
   lanes [sum(a0) .. sum(a3), sum(b0) .. sum(b3)]. */
KVA__FORCEINLINE __m256i kva__hsum8_epi32_avx2(__m256i a0, __m256i a1, __m256i a2, __m256i a3, __m256i b0,
                                              __m256i b1, __m256i b2, __m256i b3) {
  __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(b0, b1), _mm256_hadd_epi32(b2, b3));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}
KVA__FORCEINLINE __m256 kva__hsum8_ps_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 b0, __m256 b1,
                                          __m256 b2, __m256 b3) {
  __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
/* An INT4 group's 16 code bytes as 32 unsigned bytes: the low nibbles (even
   elements), then the high ones, the order of the query's group codes. */
KVA__FORCEINLINE __m256i kva__i4_codes32_avx2(const uint8_t *codes) {
  __m128i b = _mm_loadu_si128((const __m128i *)codes), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
/* lanes r and 4 + r of v (the two keys' scores of row r) into the score rows */
KVA__FORCEINLINE void kva__store_pair_scores_avx2(__m256 v, int nr, float *scores, int lds, int j, int both) {
  float KVA__ALIGN(32) x[8];
  int r;
  _mm256_store_ps(x, v);
  for (r = 0; r < nr; r++) {
    scores[r * lds + j] = x[r];
    if (both) scores[r * lds + j + 1] = x[4 + r];
  }
}

/* Two keys per step against up to four query rows (8 accumulator chains),
   whole groups of 32 in vectors, a shorter rest through the scalar twin's helpers. */
KVA__FORCEINLINE void kva__idot_tile_avx2(const kva_dtype t, const kva__qrow *q, const int nr,
                                          const void *const *krows, int nk, int d, float *scores, int lds,
                                          const kva__next_tile *next) {
  const int full = d / 32 * 32, groups = full / 32;
  const int8_t *qc[4];
  float gsum4[KVA__IQ_MAX_D / 32][4]; /* INT4: each whole group's code sums, the four rows side by side */
  __m256 qscale;
  __m256i corr;
  int j, i, r, g;
  for (r = 0; r < 4; r++) qc[r] = q[nr > r ? r : 0].codes;
  qscale = _mm256_setr_ps(q[0].scale, q[nr > 1 ? 1 : 0].scale, q[nr > 2 ? 2 : 0].scale, q[nr > 3 ? 3 : 0].scale,
                          q[0].scale, q[nr > 1 ? 1 : 0].scale, q[nr > 2 ? 2 : 0].scale, q[nr > 3 ? 3 : 0].scale);
  corr = _mm256_setzero_si256();
  if (t == KVA_INT8 && KVA__VNNI) { /* the bias vpdpbusd's unsigned keys add: 128 * the codes' sum */
    int32_t c4[4];
    for (r = 0; r < 4; r++) c4[r] = 128 * q[nr > r ? r : 0].full_sum;
    corr = _mm256_setr_epi32(c4[0], c4[1], c4[2], c4[3], c4[0], c4[1], c4[2], c4[3]);
  }
  if (t == KVA_INT4)
    for (g = 0; g < groups; g++)
      for (r = 0; r < 4; r++) gsum4[g][r] = (float)q[nr > r ? r : 0].gsum[g];
  for (j = 0; j < nk; j += 2) { /* past the end, k1 repeats k0; not stored */
    const uint8_t *k0 = (const uint8_t *)krows[j], *k1 = (const uint8_t *)krows[j + 1 < nk ? j + 1 : j];
    __m256 sc;
    kva__prefetch_next(next, j);
    kva__prefetch_next(next, j + 1);
    if (t == KVA_INT8) {
      __m256i a00 = _mm256_setzero_si256(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00,
              a31 = a00, s8;
      const __m256i bias = _mm256_set1_epi8((char)0x80);
      for (i = 0; i < full; i += 32) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(k0 + i)), b0 = _mm256_xor_si256(x0, bias);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(k1 + i)), b1 = _mm256_xor_si256(x1, bias), qv;
        qv = _mm256_loadu_si256((const __m256i *)(qc[0] + i));
        a00 = kva__idot32_i8_avx2(a00, b0, x0, qv);
        a01 = kva__idot32_i8_avx2(a01, b1, x1, qv);
        if (nr > 1) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[1] + i));
          a10 = kva__idot32_i8_avx2(a10, b0, x0, qv);
          a11 = kva__idot32_i8_avx2(a11, b1, x1, qv);
        }
        if (nr > 2) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[2] + i));
          a20 = kva__idot32_i8_avx2(a20, b0, x0, qv);
          a21 = kva__idot32_i8_avx2(a21, b1, x1, qv);
        }
        if (nr > 3) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[3] + i));
          a30 = kva__idot32_i8_avx2(a30, b0, x0, qv);
          a31 = kva__idot32_i8_avx2(a31, b1, x1, qv);
        }
      }
      s8 = _mm256_sub_epi32(kva__hsum8_epi32_avx2(a00, a10, a20, a30, a01, a11, a21, a31), corr);
      if (full < d) {
        int32_t rest[8];
        for (r = 0; r < 4; r++) {
          rest[r] = kva__idot_i8_rest(qc[r], (const int8_t *)k0, full, d);
          rest[4 + r] = kva__idot_i8_rest(qc[r], (const int8_t *)k1, full, d);
        }
        s8 = _mm256_add_epi32(s8, _mm256_loadu_si256((const __m256i *)rest));
      }
      sc = _mm256_mul_ps(_mm256_cvtepi32_ps(s8),
                         _mm256_mul_ps(qscale, _mm256_set_m128(_mm_set1_ps(kva__row_scale(KVA_INT8, k1, 1.0f)),
                                                               _mm_set1_ps(kva__row_scale(KVA_INT8, k0, 1.0f)))));
    } else { /* INT4: gscale * dot per lane in float; the minimums' part per row, four rows at once */
      __m256 f00 = _mm256_setzero_ps(), f10 = f00, f20 = f00, f30 = f00, f01 = f00, f11 = f00, f21 = f00, f31 = f00;
      __m128 m0 = _mm_setzero_ps(), m1 = m0;
      const __m256i z = _mm256_setzero_si256();
      for (g = 0, i = 0; i < full; g++, i += 32) {
        float gs0, gs1, gmin0, gmin1;
        const __m256i x0 = kva__i4_codes32_avx2(kva__i4_group(k0, i, &gs0, &gmin0));
        const __m256i x1 = kva__i4_codes32_avx2(kva__i4_group(k1, i, &gs1, &gmin1));
        const __m256 s0 = _mm256_set1_ps(gs0), s1 = _mm256_set1_ps(gs1);
        const __m128 gs = _mm_loadu_ps(gsum4[g]);
        __m256i qv = _mm256_loadu_si256((const __m256i *)(qc[0] + i));
        m0 = _mm_fmadd_ps(_mm_set1_ps(gmin0), gs, m0);
        m1 = _mm_fmadd_ps(_mm_set1_ps(gmin1), gs, m1);
        f00 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x0, qv)), s0, f00);
        f01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x1, qv)), s1, f01);
        if (nr > 1) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[1] + i));
          f10 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x0, qv)), s0, f10);
          f11 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x1, qv)), s1, f11);
        }
        if (nr > 2) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[2] + i));
          f20 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x0, qv)), s0, f20);
          f21 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x1, qv)), s1, f21);
        }
        if (nr > 3) {
          qv = _mm256_loadu_si256((const __m256i *)(qc[3] + i));
          f30 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x0, qv)), s0, f30);
          f31 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(KVA__DPBUSD256(z, x1, qv)), s1, f31);
        }
      }
      sc = _mm256_add_ps(kva__hsum8_ps_avx2(f00, f10, f20, f30, f01, f11, f21, f31), _mm256_set_m128(m1, m0));
      if (full < d) {
        float KVA__ALIGN(32) rest[8];
        for (r = 0; r < 4; r++) {
          rest[r] = kva__idot_i4_rest(&q[nr > r ? r : 0], k0, groups, d);
          rest[4 + r] = kva__idot_i4_rest(&q[nr > r ? r : 0], k1, groups, d);
        }
        sc = _mm256_add_ps(sc, _mm256_load_ps(rest));
      }
      sc = _mm256_mul_ps(qscale, sc);
    }
    kva__store_pair_scores_avx2(sc, nr, scores, lds, j, j + 1 < nk);
  }
}

/* --- integer values: four keys x 32 channels per step (the scalar twin
   says what). The interleave is two rounds of byte and word unpacks, which
   work inside each 128-bit half: vector k of a step holds channels
   4k .. 4k + 3 and 16 + 4k .. 19 + 4k, put back in order once per row at
   the end. The products are exact: VNNI's vpdpbusd; without it, INT4's
   maddubs pairs stay below 2 * 255 * 15, and INT8's bytes are widened to
   16 bits for madd. --- */
KVA__FORCEINLINE __m256i kva__iv_dp_avx2(__m256i acc, __m256i u, __m256i x, const int i4) {
#if KVA__VNNI
  (void)i4;
  return KVA__DPBUSD256(acc, u, x);
#else
  if (i4) return KVA__DPBUSD256(acc, u, x);
  {
    const __m256i low = _mm256_set1_epi16(0xff);
    __m256i even = _mm256_madd_epi16(_mm256_and_si256(u, low), _mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8));
    __m256i odd = _mm256_madd_epi16(_mm256_srli_epi16(u, 8), _mm256_srai_epi16(x, 8));
    return _mm256_add_epi32(acc, _mm256_add_epi32(even, odd));
  }
#endif
}
/* one key's 32 codes of a step as bytes in channel order */
KVA__FORCEINLINE __m256i kva__iv_codes32_avx2(const uint8_t *p, const int i4) {
  if (i4) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  }
  return _mm256_loadu_si256((const __m256i *)p);
}
KVA__FORCEINLINE void kva__ilv4_avx2(uint8_t *dst, const uint8_t *const *rows, const int i4) {
  const __m256i a0 = kva__iv_codes32_avx2(rows[0], i4), a1 = kva__iv_codes32_avx2(rows[1], i4);
  const __m256i a2 = kva__iv_codes32_avx2(rows[2], i4), a3 = kva__iv_codes32_avx2(rows[3], i4);
  const __m256i lo01 = _mm256_unpacklo_epi8(a0, a1), hi01 = _mm256_unpackhi_epi8(a0, a1);
  const __m256i lo23 = _mm256_unpacklo_epi8(a2, a3), hi23 = _mm256_unpackhi_epi8(a2, a3);
  _mm256_storeu_si256((__m256i *)dst, _mm256_unpacklo_epi16(lo01, lo23));
  _mm256_storeu_si256((__m256i *)(dst + 32), _mm256_unpackhi_epi16(lo01, lo23));
  _mm256_storeu_si256((__m256i *)(dst + 64), _mm256_unpacklo_epi16(hi01, hi23));
  _mm256_storeu_si256((__m256i *)(dst + 96), _mm256_unpackhi_epi16(hi01, hi23));
}
KVA__FORCEINLINE __m256i kva__iv_bcast4_avx2(const uint8_t *u) { return _mm256_set1_epi32(kva__iv_u4(u)); }
#define KVA__IV_INIT_AVX2(r, c) __m256i a##r##c = _mm256_setzero_si256();
#define KVA__IV_DP_AVX2(r, c) if (nr > r) a##r##c = kva__iv_dp_avx2(a##r##c, u##r, x##c, i4);
/* row r's sums, vectors a<r>0 .. a<r>3 in the interleave's order, into out in channel order */
#define KVA__IV_OUT_ORDER_AVX2(r, a)                                                                          \
  _mm256_storeu_ps(out + r * KVA__IV_CH, _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a##r##0, a##r##1, 0x20)));      \
  _mm256_storeu_ps(out + r * KVA__IV_CH + 8, _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a##r##2, a##r##3, 0x20)));  \
  _mm256_storeu_ps(out + r * KVA__IV_CH + 16, _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a##r##0, a##r##1, 0x31))); \
  _mm256_storeu_ps(out + r * KVA__IV_CH + 24, _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a##r##2, a##r##3, 0x31)));
#define KVA__IV_OUT_AVX2(r) \
  if (nr > r) {             \
    KVA__IV_OUT_ORDER_AVX2(r, a) \
  }
KVA__FORCEINLINE void kva__iprod_avx2(float *out, const uint8_t *ilv, int nk4, const uint8_t *u, int ldu,
                                      const int nr, const int i4) {
  const __m256i z = _mm256_setzero_si256();
  int j;
  KVA__EACH_4X4(KVA__IV_INIT_AVX2)
  for (j = 0; j < nk4; j += 4, ilv += KVA__IV_BYTES) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)ilv), x1 = _mm256_loadu_si256((const __m256i *)(ilv + 32));
    const __m256i x2 = _mm256_loadu_si256((const __m256i *)(ilv + 64)), x3 = _mm256_loadu_si256((const __m256i *)(ilv + 96));
    const __m256i u0 = kva__iv_bcast4_avx2(u + j), u1 = nr > 1 ? kva__iv_bcast4_avx2(u + ldu + j) : z;
    const __m256i u2 = nr > 2 ? kva__iv_bcast4_avx2(u + 2 * ldu + j) : z;
    const __m256i u3 = nr > 3 ? kva__iv_bcast4_avx2(u + 3 * ldu + j) : z;
    KVA__EACH_4X4(KVA__IV_DP_AVX2)
  }
  KVA__IV_OUT_AVX2(0) KVA__IV_OUT_AVX2(1) KVA__IV_OUT_AVX2(2) KVA__IV_OUT_AVX2(3)
}

/* The scalar twin's double operations, four values at a time: the same codes. */
static inline void kva__i4_encode_avx2(uint8_t *codes, const float *src, int m, float mn, float scale) {
  int i = 0;
  if (scale > 0.0f) {
    const __m256d vmn = _mm256_set1_pd((double)mn), vscale = _mm256_set1_pd((double)scale);
    for (; i + 4 <= m; i += 4) {
      __m256d v = _mm256_div_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(src + i)), vmn), vscale);
      __m128i c;
      /* (int)(v + 0.5) for v in (0, 15) is its floor; max() maps NaN to 0, min() caps at 15 */
      v = _mm256_floor_pd(_mm256_add_pd(v, _mm256_set1_pd(0.5)));
      v = _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(15.0));
      c = _mm256_cvtpd_epi32(v);
      codes[i / 2] = (uint8_t)(_mm_cvtsi128_si32(c) | _mm_extract_epi32(c, 1) << 4);
      codes[i / 2 + 1] = (uint8_t)(_mm_extract_epi32(c, 2) | _mm_extract_epi32(c, 3) << 4);
    }
  }
  kva__i4_encode_scalar(codes + i / 2, src + i, m - i, mn, scale); /* i is even: the same nibbles */
}

/* --- rotation --- */
/* one butterfly stage inside 8 lanes: partner = the lanes swapped at distance h, the
   lower lane of each pair keeps a + b, the upper (sign bit set in `upper`) gets a - b */
KVA__FORCEINLINE __m256 kva__fwht8_stage_avx2(__m256 v, __m256 partner, __m256 upper) {
  return _mm256_blendv_ps(_mm256_add_ps(v, partner), _mm256_sub_ps(partner, v), upper);
}
static inline void kva__fwht_avx2(float *x, int n) {
  const __m256 s = _mm256_set1_ps((float)(1.0 / sqrt((double)n)));
  int h, i, j;
  if (n < 8) {
    kva__fwht_scalar(x, n);
    return;
  }
  for (i = 0; i < n; i += 8) { /* distances 1, 2, 4 inside each vector */
    __m256 v = _mm256_loadu_ps(x + i);
    v = kva__fwht8_stage_avx2(v, _mm256_permute_ps(v, 0xb1), _mm256_setr_ps(0, -1, 0, -1, 0, -1, 0, -1));
    v = kva__fwht8_stage_avx2(v, _mm256_permute_ps(v, 0x4e), _mm256_setr_ps(0, 0, -1, -1, 0, 0, -1, -1));
    v = kva__fwht8_stage_avx2(v, _mm256_permute2f128_ps(v, v, 1), _mm256_setr_ps(0, 0, 0, 0, -1, -1, -1, -1));
    _mm256_storeu_ps(x + i, v);
  }
  KVA__FWHT_WIDE(KVA__AVX2_);
}
#endif /* AVX2 */

#if KVATTN_SIMD == KVA_SIMD_AVX512
/* --- AVX-512 (F, BW, VL): 16 lanes; tails use masked loads, which never
   touch memory outside the mask, so no scalar tail loops --- */

/* lanes i .. min(i+16, n)-1 */
KVA__FORCEINLINE __mmask16 kva__mask16(int i, int n) {
  return n - i >= 16 ? (__mmask16)0xffff : n <= i ? (__mmask16)0 : (__mmask16)((1u << (n - i)) - 1u);
}

/* An INT4 group's 16 possible values, code * scale + min, from its F16
   scale and minimum (one broadcast word, converted in every lane pair; the
   product is exact, so the FMA rounds as a multiply and an add would) */
KVA__FORCEINLINE __m512 kva__i4_lut_avx512(const uint8_t *group) {
  int32_t h;
  __m512 sm;
  memcpy(&h, group, sizeof h);
  sm = _mm512_cvtph_ps(_mm256_set1_epi32(h));
  return _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_moveldup_ps(sm),
                         _mm512_movehdup_ps(sm));
}
/* 16 values from 8 code bytes (the low 8 of b) by the group's table: vpermps reads the low 4
   bits of a lane's index, so a byte's low nibble needs no mask */
KVA__FORCEINLINE __m512 kva__i4_pick16_avx512(__m128i b, __m512 lut) {
  const __m128i pairs = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  return _mm512_permutexvar_ps(
      _mm512_srlv_epi32(_mm512_cvtepu8_epi32(pairs), _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)),
      lut);
}
/* 16 INT4 elements from i (a multiple of 16) that mask m (low lanes) selects; the
   bytes outside it are not read */
KVA__FORCEINLINE __m512 kva__load16_i4_avx512(const void *row, int i, __mmask16 m) {
  float s, mn;
  const uint8_t *codes;
  unsigned lanes = m, n;
  __m512i c;
  if (!m) return _mm512_setzero_ps(); /* (past the row: not even its group) */
  if (m == 0xffffu) {
    /* a whole half group: the group's 16 possible values (code * scale + min, rounded as
       below) fill one register, and each lane picks its own by its code: vpermps reads
       the low 4 bits of a lane's index, so a byte's low nibble needs no mask. The F16
       scale and minimum come as one broadcast word, converted in every lane pair. */
    const uint8_t *g = (const uint8_t *)row + (size_t)(i / KVA__I4_GROUP) * KVA__I4_GROUP_BYTES;
    codes = g + KVA__I4_PARAM_BYTES + (i % KVA__I4_GROUP) / 2;
    return kva__i4_pick16_avx512(_mm_loadl_epi64((const __m128i *)codes), kva__i4_lut_avx512(g));
  }
  codes = kva__i4_group(row, i, &s, &mn) + (i % KVA__I4_GROUP) / 2;
  lanes = lanes - ((lanes >> 1) & 0x5555u); /* popcount of 16 bits */
  lanes = (lanes & 0x3333u) + ((lanes >> 2) & 0x3333u);
  n = (((lanes + (lanes >> 4)) & 0x0f0fu) * 0x0101u & 0xffffu) >> 8;
  c = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(_mm_maskz_loadu_epi8((__mmask16)((1u << ((n + 1) / 2)) - 1u), codes),
                                            _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
  c = _mm512_and_si512(_mm512_srlv_epi32(c, _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)),
                       _mm512_set1_epi32(15));
  return _mm512_maskz_add_ps(m, _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(s)), _mm512_set1_ps(mn));
}

/* A whole INT4 group from i (a multiple of 32) as two vectors: the lookup
   table of kva__load16_i4_avx512 built once for both halves */
KVA__FORCEINLINE void kva__load32_i4_avx512(const void *row, int i, __m512 *lo, __m512 *hi) {
  const uint8_t *g = (const uint8_t *)row + (size_t)(i / KVA__I4_GROUP) * KVA__I4_GROUP_BYTES;
  const __m512 lut = kva__i4_lut_avx512(g);
  const __m128i b = _mm_loadu_si128((const __m128i *)(g + KVA__I4_PARAM_BYTES));
  *lo = kva__i4_pick16_avx512(b, lut);
  *hi = kva__i4_pick16_avx512(_mm_unpackhi_epi64(b, b), lut);
}

/* the elements of a row from element i that mask m selects (the others 0) */
KVA__FORCEINLINE __m512 kva__load16_avx512(const kva_dtype t, const void *row, int i, __mmask16 m) {
  const uint8_t *b = (const uint8_t *)row + i;
  switch (t) {
    case KVA_INT4: return kva__load16_i4_avx512(row, i, m);
    case KVA_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    case KVA_BF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i)), 16));
    case KVA_INT8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b)));
    case KVA_FP8_E5M2: return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, b)), 8));
    case KVA_FP8_E4M3: { /* as kva__load8_avx2 */
      __m256i x = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, b));
      return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16((short)0xbf80)));
    }
    default: return _mm512_maskz_loadu_ps(m, (const float *)row + i);
  }
}

/* the vector mapping (see KVA__EXP_SUB_SUM): 16 lanes, the last step masked */
#define KVA__AVX512_F __m512
#define KVA__AVX512_N 16
#define KVA__AVX512_MORE(i, n) ((i) < (n))
#define KVA__AVX512_MASK __mmask16
#define KVA__AVX512_LANES(i, n) kva__mask16(i, n)
#define KVA__AVX512_LOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define KVA__AVX512_STORE(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define KVA__AVX512_ROW(t, row, i, m) kva__load16_avx512(t, row, i, m)
#define KVA__AVX512_ROW_PAIR(t, row, i, ma, mb, both, va, vb)                  \
  do {                                                                       \
    if ((t) == KVA_INT4 && (both) && (mb) == 0xffffu) {                      \
      kva__load32_i4_avx512(row, i, &(va), &(vb));                           \
    } else {                                                                 \
      (va) = kva__load16_avx512(t, row, i, ma);                              \
      (vb) = (both) ? kva__load16_avx512(t, row, (i) + 16, mb) : _mm512_setzero_ps(); \
    }                                                                        \
  } while (0)
#define KVA__AVX512_ZERO _mm512_setzero_ps()
#define KVA__AVX512_SET1(x) _mm512_set1_ps(x)
#define KVA__AVX512_ADD(a, b) _mm512_add_ps(a, b)
#define KVA__AVX512_SUB(a, b) _mm512_sub_ps(a, b)
#define KVA__AVX512_MUL(a, b) _mm512_mul_ps(a, b)
#define KVA__AVX512_MIN(a, b) _mm512_min_ps(a, b)
#define KVA__AVX512_MAX(a, b) _mm512_max_ps(a, b)
#define KVA__AVX512_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KVA__AVX512_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define KVA__AVX512_MAX_IN(mx, v, m) _mm512_mask_max_ps(mx, m, mx, v)
#define KVA__AVX512_HSUM(v) _mm512_reduce_add_ps(v)
#define KVA__AVX512_HMAX(v) _mm512_reduce_max_ps(v)
#define KVA__AVX512_ROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define KVA__AVX512_POW2(p, t) \
  _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_cvtps_epi32(t), 23)))
#define KVA__AVX512_KEEP_T __mmask16
#define KVA__AVX512_KEEP(v, lo, m) (_mm512_cmp_ps_mask(v, lo, _CMP_GE_OQ) & (m))
#define KVA__AVX512_KEEP_ONLY(k, p) _mm512_maskz_mov_ps(k, p)
#define KVA__AVX512_S_T __m512
#define KVA__AVX512_S(p, k) _mm512_set1_ps((p)[k])
#define KVA__AVX512_S_ZERO _mm512_setzero_ps()
#define KVA__AVX512_FMA_S(a, v, s) _mm512_fmadd_ps(s, v, a)

/* Without this, gcc folds each q load into all four FMAs that use it as a
   memory operand: four loads where one does, and the loads bound the kernel. */
#if defined(__GNUC__) || defined(__clang__)
#define KVA__IN_REGISTERS(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d));
#else
#define KVA__IN_REGISTERS(a, b, c, d)
#endif

/* The 16 sums of a[4*key + row] as one vector: 128-bit lane `row`, element
   `key`. A transpose-and-add tree: 45 shuffles and adds for 16 sums. */
KVA__FORCEINLINE __m512 kva__pair512(__m512 a, __m512 b) { /* [a halves, b halves] */
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}
KVA__FORCEINLINE __m512 kva__quad512(__m512 b0, __m512 b1) { /* lane c: quarter sums of input c */
  return _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xdd));
}
KVA__FORCEINLINE __m512 kva__sum16_512(const __m512 *a) {
  __m512 c0 = kva__quad512(kva__pair512(a[0], a[1]), kva__pair512(a[2], a[3]));
  __m512 c1 = kva__quad512(kva__pair512(a[4], a[5]), kva__pair512(a[6], a[7]));
  __m512 c2 = kva__quad512(kva__pair512(a[8], a[9]), kva__pair512(a[10], a[11]));
  __m512 c3 = kva__quad512(kva__pair512(a[12], a[13]), kva__pair512(a[14], a[15]));
  __m512 d0 = _mm512_add_ps(_mm512_unpacklo_ps(c0, c1), _mm512_unpackhi_ps(c0, c1));
  __m512 d1 = _mm512_add_ps(_mm512_unpacklo_ps(c2, c3), _mm512_unpackhi_ps(c2, c3));
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(d0), _mm512_castps_pd(d1))),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(d0), _mm512_castps_pd(d1))));
}

/* A score step's output: row r's scores of keys j..j+3 (those < nk) from
   lane r of the summed accumulators, times the keys' row scales. */
KVA__FORCEINLINE void kva__dot_out_avx512(const kva_dtype t, const int nr, const __m512 *sums,
                                          const void *const *k4, float fp8_scale, float *scores, int lds,
                                          int j, int nk) {
  const __mmask8 keys = (__mmask8)(nk - j >= 4 ? 0xf : (1u << (nk - j)) - 1u);
  __m512 e = kva__sum16_512(sums);
  if (kva__is_scaled(t))
    e = _mm512_mul_ps(e, _mm512_broadcast_f32x4(_mm_setr_ps(
                             kva__row_scale(t, k4[0], fp8_scale), kva__row_scale(t, k4[1], fp8_scale),
                             kva__row_scale(t, k4[2], fp8_scale), kva__row_scale(t, k4[3], fp8_scale))));
  _mm_mask_storeu_ps(scores + j, keys, _mm512_castps512_ps128(e));
  if (nr > 1) _mm_mask_storeu_ps(scores + lds + j, keys, _mm512_extractf32x4_ps(e, 1));
  if (nr > 2) _mm_mask_storeu_ps(scores + 2 * lds + j, keys, _mm512_extractf32x4_ps(e, 2));
  if (nr > 3) _mm_mask_storeu_ps(scores + 3 * lds + j, keys, _mm512_extractf32x4_ps(e, 3));
}

/* Scores: four keys per step against up to four query rows: 16 independent
   FMA chains, and each loaded q vector serves four keys (with one key per
   step, q loads outnumber the FMAs). Accumulator s<row><key>. One step over
   16 elements is this macro, so that the unmasked steps and the masked last
   step share it and the 16 accumulators stay plain locals. */
#define KVA__D512_INIT(r, k) __m512 s##r##k = z;
#define KVA__D512_FMA(r, k) if (nr > r) s##r##k = _mm512_fmadd_ps(qv##r, x##k, s##r##k);
#define KVA__D512_GATHER(r, k) sums[4 * k + r] = s##r##k;
#define KVA__DOT512_STEP(mask)                                                                                 \
  {                                                                                                            \
    const __mmask16 m = (mask);                                                                                \
    __m512 x0 = kva__load16_avx512(t, k4[0], i, m), x1 = kva__load16_avx512(t, k4[1], i, m);                   \
    __m512 x2 = kva__load16_avx512(t, k4[2], i, m), x3 = kva__load16_avx512(t, k4[3], i, m);                   \
    __m512 qv0 = _mm512_maskz_loadu_ps(m, q0 + i);                                                             \
    __m512 qv1 = nr > 1 ? _mm512_maskz_loadu_ps(m, q1 + i) : z;                                                \
    __m512 qv2 = nr > 2 ? _mm512_maskz_loadu_ps(m, q2 + i) : z;                                                \
    __m512 qv3 = nr > 3 ? _mm512_maskz_loadu_ps(m, q3 + i) : z;                                                \
    KVA__IN_REGISTERS(qv0, qv1, qv2, qv3)                                                                      \
    KVA__EACH_4X4(KVA__D512_FMA)                                                                               \
  }
/* INT4 keys, one whole group per step: each key's group loads as two
   vectors from one conversion of its scale and minimum (kva__load32_i4_avx512) */
#define KVA__D512_FMA2(r, k) \
  if (nr > r) s##r##k = _mm512_fmadd_ps(qb##r, hi, _mm512_fmadd_ps(qa##r, lo, s##r##k));
#define KVA__DOT512_I4_KEY(k)                      \
  {                                                \
    __m512 lo, hi;                                 \
    kva__load32_i4_avx512(k4[k], i, &lo, &hi);     \
    KVA__D512_FMA2(0, k) KVA__D512_FMA2(1, k)      \
    KVA__D512_FMA2(2, k) KVA__D512_FMA2(3, k)      \
  }
#define KVA__DOT512_I4_GROUP                                                                                      \
  {                                                                                                             \
    __m512 qa0 = _mm512_loadu_ps(q0 + i), qb0 = _mm512_loadu_ps(q0 + i + 16);                                     \
    __m512 qa1 = nr > 1 ? _mm512_loadu_ps(q1 + i) : z, qb1 = nr > 1 ? _mm512_loadu_ps(q1 + i + 16) : z;          \
    __m512 qa2 = nr > 2 ? _mm512_loadu_ps(q2 + i) : z, qb2 = nr > 2 ? _mm512_loadu_ps(q2 + i + 16) : z;          \
    __m512 qa3 = nr > 3 ? _mm512_loadu_ps(q3 + i) : z, qb3 = nr > 3 ? _mm512_loadu_ps(q3 + i + 16) : z;          \
    KVA__IN_REGISTERS(qa0, qa1, qa2, qa3)                                                                       \
    KVA__IN_REGISTERS(qb0, qb1, qb2, qb3)                                                                       \
    KVA__DOT512_I4_KEY(0) KVA__DOT512_I4_KEY(1) KVA__DOT512_I4_KEY(2) KVA__DOT512_I4_KEY(3)                     \
  }
KVA__FORCEINLINE void kva__dot_tile_avx512(const kva_dtype t, const float *const *q, const int nr,
                                           const void *const *krows, int nk, int d, float *scores, int lds,
                                           float fp8_scale, const kva__next_tile *next) {
  const __m512 z = _mm512_setzero_ps();
  const float *q0 = q[0], *q1 = q[nr > 1 ? 1 : 0], *q2 = q[nr > 2 ? 2 : 0], *q3 = q[nr > 3 ? 3 : 0];
  int j, i, r;
  for (j = 0; j < nk; j += 4) {
    const void *k4[4]; /* past the end, the last key repeats; not stored */
    __m512 sums[16];
    KVA__EACH_4X4(KVA__D512_INIT)
    for (r = 0; r < 4; r++) k4[r] = krows[j + r < nk ? j + r : j];
    for (r = 0; r < 4; r++) kva__prefetch_next(next, j + r);
    i = 0;
    if (t == KVA_INT4)
      for (; i + 32 <= d; i += 32) KVA__DOT512_I4_GROUP
    for (; i + 16 <= d; i += 16) KVA__DOT512_STEP((__mmask16)0xffff)
    if (i < d) KVA__DOT512_STEP(kva__mask16(i, d))
    KVA__EACH_4X4(KVA__D512_GATHER)
    kva__dot_out_avx512(t, nr, sums, k4, fp8_scale, scores, lds, j, nk);
  }
}

/* one strip of nv (<= 4) vectors of 16 columns from column i, nr rows */
KVA__FORCEINLINE void kva__vacc_strip_avx512(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                             int ldp, const void *const *vrows, int nk, int i, const int nv, int dv) {
  KVA__VACC_STRIP(KVA__AVX512_)
}
KVA__FORCEINLINE void kva__vacc_tile_avx512(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                            int ldp, const void *const *vrows, int nk, int dv, float fp8_scale) {
  float pbuf[KVA__NR * KVA__TILE];
  int i, rest;
  p = kva__scale_probs(t, p, &ldp, nr, vrows, nk, fp8_scale, pbuf);
  for (i = 0; i + 64 <= dv; i += 64) kva__vacc_strip_avx512(t, acc, nr, p, ldp, vrows, nk, i, 4, dv);
  rest = (dv - i + 15) / 16; /* vectors left, the last one masked */
  if (rest == 1) kva__vacc_strip_avx512(t, acc, nr, p, ldp, vrows, nk, i, 1, dv);
  if (rest == 2) kva__vacc_strip_avx512(t, acc, nr, p, ldp, vrows, nk, i, 2, dv);
  if (rest == 3) kva__vacc_strip_avx512(t, acc, nr, p, ldp, vrows, nk, i, 3, dv);
  if (rest == 4) kva__vacc_strip_avx512(t, acc, nr, p, ldp, vrows, nk, i, 4, dv);
}

/* x[r] (row r of a 16 x 16 block) becomes column r: pairs, then quads
   within 128-bit lanes, then the lanes themselves. */
KVA__FORCEINLINE void kva__transpose16_avx512(__m512 *x) {
  __m512 t[16];
  int i, k;
  for (i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
  }
  for (i = 0; i < 16; i += 4) { /* x[i + k]: lane L holds element 4L + k of rows i .. i+3 */
    x[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    x[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    x[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    x[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  for (k = 0; k < 4; k++) { /* element 4L + k of all 16 rows: lane L of x[k], x[4+k], x[8+k], x[12+k] */
    __m512 a = _mm512_shuffle_f32x4(x[k], x[4 + k], 0x88), b = _mm512_shuffle_f32x4(x[k], x[4 + k], 0xdd);
    __m512 c = _mm512_shuffle_f32x4(x[8 + k], x[12 + k], 0x88), e = _mm512_shuffle_f32x4(x[8 + k], x[12 + k], 0xdd);
    t[k] = _mm512_shuffle_f32x4(a, c, 0x88);
    t[8 + k] = _mm512_shuffle_f32x4(a, c, 0xdd);
    t[4 + k] = _mm512_shuffle_f32x4(b, e, 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(b, e, 0xdd);
  }
  for (i = 0; i < 16; i++) x[i] = t[i];
}
KVA__FORCEINLINE void kva__kt_fill_avx512(const kva_dtype t, const void *const *krows, int nk, int i0, int d,
                                          float *kt) {
  int nd = d - i0 < KVA__KT_DEPTH ? d - i0 : KVA__KT_DEPTH, j0, c0, r;
  for (j0 = 0; j0 < KVA__TILE; j0 += 16) {
    for (c0 = 0; c0 < nd; c0 += 16) {
      const __mmask16 m = kva__mask16(i0 + c0, d);
      __m512 x[16];
      for (r = 0; r < 16; r++)
        x[r] = j0 + r < nk ? kva__load16_avx512(t, krows[j0 + r], i0 + c0, m) : _mm512_setzero_ps();
      kva__transpose16_avx512(x);
      for (r = 0; r < 16; r++) _mm512_storeu_ps(kt + (c0 + r) * KVA__TILE + j0, x[r]);
    }
  }
}

/* Integer values over 512 bits (with AVX512-VNNI): the AVX2 interleave's
   vectors 0-1 and 2-3 as one register each, two vpdpbusd per row and step
   (EVEX: the 32 registers hold 8 accumulators and the operands), split
   back into the AVX2 order for its output. */
#if defined(__AVX512VNNI__)
#define KVA__IV_INIT_AVX512(r) __m512i a##r##0 = _mm512_setzero_si512(), a##r##1 = _mm512_setzero_si512();
#define KVA__IV_DP_AVX512(r)                                                      \
  if (nr > r) {                                                                   \
    const __m512i ub = _mm512_set1_epi32(kva__iv_u4(ur + r * ldu + j));           \
    a##r##0 = _mm512_dpbusd_epi32(a##r##0, ub, x0);                               \
    a##r##1 = _mm512_dpbusd_epi32(a##r##1, ub, x1);                               \
  }
#define KVA__IV_OUT_AVX512(r)                                                                               \
  if (nr > r) {                                                                                             \
    const __m256i b##r##0 = _mm512_castsi512_si256(a##r##0), b##r##1 = _mm512_extracti64x4_epi64(a##r##0, 1); \
    const __m256i b##r##2 = _mm512_castsi512_si256(a##r##1), b##r##3 = _mm512_extracti64x4_epi64(a##r##1, 1); \
    KVA__IV_OUT_ORDER_AVX2(r, b)                                                                            \
  }
KVA__FORCEINLINE void kva__iprod_avx512(float *out, const uint8_t *ilv, int nk4, const uint8_t *u, int ldu,
                                        const int nr, const int i4) {
  const uint8_t *ur = u;
  int j;
  KVA__IV_INIT_AVX512(0) KVA__IV_INIT_AVX512(1) KVA__IV_INIT_AVX512(2) KVA__IV_INIT_AVX512(3)
  (void)i4; /* the products are exact for both */
  for (j = 0; j < nk4; j += 4, ilv += KVA__IV_BYTES) {
    const __m512i x0 = _mm512_loadu_si512((const void *)ilv), x1 = _mm512_loadu_si512((const void *)(ilv + 64));
    KVA__IV_DP_AVX512(0) KVA__IV_DP_AVX512(1) KVA__IV_DP_AVX512(2) KVA__IV_DP_AVX512(3)
  }
  KVA__IV_OUT_AVX512(0) KVA__IV_OUT_AVX512(1) KVA__IV_OUT_AVX512(2) KVA__IV_OUT_AVX512(3)
}
#endif

/* scores of keys 16c .. 16c+15 (those < nk) of one row: this chunk's sum s */
KVA__FORCEINLINE void kva__wstore_avx512(float *dst, __mmask16 m, __m512 s, int first, const float *ks) {
  if (!first) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), s);
  if (ks) s = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, ks));
  _mm512_mask_storeu_ps(dst, m, s);
}
#define KVA__W512_FMA(r, c) if (nr > r) s##r##c = _mm512_fmadd_ps(qv##r, x##c, s##r##c);
#define KVA__W512_STORE(r, c) \
  if (nr > r) kva__wstore_avx512(scores + r * lds + 16 * c, m##c, s##r##c, first, ks ? ks + 16 * c : NULL);
KVA__FORCEINLINE void kva__wdot_rows_avx512(const float *const *q, const int nr, int nk, int i0, int nd,
                                            const float *kt, float *scores, int lds, int first, const float *ks) {
  const __m512 z = _mm512_setzero_ps();
  const __mmask16 m0 = kva__mask16(0, nk), m1 = kva__mask16(16, nk), m2 = kva__mask16(32, nk),
                  m3 = kva__mask16(48, nk);
  const float *q0 = q[0] + i0, *q1 = q[nr > 1 ? 1 : 0] + i0, *q2 = q[nr > 2 ? 2 : 0] + i0,
              *q3 = q[nr > 3 ? 3 : 0] + i0;
  int c;
  KVA__EACH_4X4(KVA__D512_INIT)
  for (c = 0; c < nd; c++) {
    const float *kr = kt + c * KVA__TILE;
    __m512 x0 = _mm512_loadu_ps(kr), x1 = _mm512_loadu_ps(kr + 16), x2 = _mm512_loadu_ps(kr + 32),
           x3 = _mm512_loadu_ps(kr + 48);
    __m512 qv0 = _mm512_set1_ps(q0[c]), qv1 = nr > 1 ? _mm512_set1_ps(q1[c]) : z;
    __m512 qv2 = nr > 2 ? _mm512_set1_ps(q2[c]) : z, qv3 = nr > 3 ? _mm512_set1_ps(q3[c]) : z;
    KVA__IN_REGISTERS(x0, x1, x2, x3) /* one load per key vector, not one per FMA */
    KVA__EACH_4X4(KVA__W512_FMA)
  }
  KVA__EACH_4X4(KVA__W512_STORE)
}
KVA__FORCEINLINE void kva__wdot_tile_avx512(const kva_dtype t, const float *const *q, int nr,
                                            const void *const *krows, int nk, int d, float *scores, int lds,
                                            float fp8_scale, const kva__next_tile *next) {
  kva__wdot_tile_with(t, q, nr, krows, nk, d, scores, lds, fp8_scale, next, kva__kt_fill_avx512,
                      kva__wdot_rows_avx512);
}

static inline float kva__exp_sub_sum_avx512(float *x, int n, float m) { KVA__EXP_SUB_SUM(KVA__AVX512_) }
static inline float kva__scale_max_avx512(float *x, int n, float scale) { KVA__SCALE_MAX(KVA__AVX512_) }
static inline void kva__block_bound_avx512(const float *const *q, int nr, const uint16_t *lohi, int d,
                                           float *bound) {
  KVA__BLOCK_BOUND(KVA__AVX512_)
}
#endif /* AVX-512 */

#if KVATTN_SIMD == KVA_SIMD_NEON
/* --- NEON (AArch64) --- */

/* 4 bytes at a time without reading past the row */
KVA__FORCEINLINE uint16x4_t kva__neon_u8x4(const void *row, int i) {
  uint32_t w;
  memcpy(&w, (const uint8_t *)row + i, 4);
  return vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w))));
}
/* 4 INT4 elements from i (a multiple of 4) */
KVA__FORCEINLINE float32x4_t kva__load4_i4_neon(const void *row, int i) {
  float s, mn;
  const uint8_t *codes = kva__i4_group(row, i, &s, &mn) + (i % KVA__I4_GROUP) / 2;
  uint32_t KVA__ALIGN(16) c[4];
  c[0] = codes[0] & 15u, c[1] = (uint32_t)codes[0] >> 4, c[2] = codes[1] & 15u, c[3] = (uint32_t)codes[1] >> 4;
  return vaddq_f32(vmulq_f32(vcvtq_f32_u32(vld1q_u32(c)), vdupq_n_f32(s)), vdupq_n_f32(mn));
}

/* 8 INT4 elements from i (a multiple of 8) as two vectors, the group's
   scale and minimum converted once */
KVA__FORCEINLINE void kva__load8_i4_neon(const void *row, int i, float32x4_t *lo, float32x4_t *hi) {
  float s, mn;
  const uint8_t *codes = kva__i4_group(row, i, &s, &mn) + (i % KVA__I4_GROUP) / 2;
  uint32_t w;
  uint8x8_t b, c;
  uint16x8_t c16;
  memcpy(&w, codes, 4);
  b = vreinterpret_u8_u32(vdup_n_u32(w));
  c = vzip_u8(vand_u8(b, vdup_n_u8(15)), vshr_n_u8(b, 4)).val[0]; /* lane 2k: byte k's low nibble */
  c16 = vmovl_u8(c);
  *lo = vaddq_f32(vmulq_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(c16))), vdupq_n_f32(s)), vdupq_n_f32(mn));
  *hi = vaddq_f32(vmulq_f32(vcvtq_f32_u32(vmovl_u16(vget_high_u16(c16))), vdupq_n_f32(s)), vdupq_n_f32(mn));
}

/* 4 elements of a row from element i; FP8 as in kva__load8_avx2 */
KVA__FORCEINLINE float32x4_t kva__load4_neon(const kva_dtype t, const void *row, int i) {
  switch (t) {
    case KVA_INT4: return kva__load4_i4_neon(row, i);
    case KVA_F16: return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)row + i)));
    case KVA_BF16: return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)row + i), 16));
    case KVA_INT8: { /* sign-extended from the byte's top bit */
      int16x4_t x = vshr_n_s16(vreinterpret_s16_u16(vshl_n_u16(kva__neon_u8x4(row, i), 8)), 8);
      return vcvtq_f32_s32(vmovl_s16(x));
    }
    case KVA_FP8_E5M2: return vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(kva__neon_u8x4(row, i), 8)));
    case KVA_FP8_E4M3: {
      uint16x4_t x = kva__neon_u8x4(row, i);
      uint16x4_t h = vorr_u16(vshl_n_u16(vand_u16(x, vdup_n_u16(0x80)), 8),
                              vshl_n_u16(vand_u16(x, vdup_n_u16(0x7f)), 7));
      return vcvt_f32_f16(vreinterpret_f16_u16(h));
    }
    default: return vld1q_f32((const float *)row + i);
  }
}

/* the vector mapping (see KVA__EXP_SUB_SUM): whole vectors of 4, a scalar tail */
#define KVA__NEON_F float32x4_t
#define KVA__NEON_N 4
#define KVA__NEON_MORE(i, n) ((i) + 4 <= (n))
#define KVA__NEON_MASK int
#define KVA__NEON_LANES(i, n) ((void)(n), 0)
#define KVA__NEON_LOAD(m, p) ((void)(m), vld1q_f32(p))
#define KVA__NEON_STORE(p, m, v) ((void)(m), vst1q_f32(p, v))
#define KVA__NEON_ROW(t, row, i, m) ((void)(m), kva__load4_neon(t, row, i))
#define KVA__NEON_ROW_PAIR(t, row, i, ma, mb, both, va, vb)              \
  do {                                                                 \
    (void)(ma), (void)(mb);                                            \
    if ((t) == KVA_INT4 && (both)) {                                   \
      kva__load8_i4_neon(row, i, &(va), &(vb));                        \
    } else {                                                           \
      (va) = kva__load4_neon(t, row, i);                               \
      (vb) = (both) ? kva__load4_neon(t, row, (i) + 4) : vdupq_n_f32(0.0f); \
    }                                                                  \
  } while (0)
#define KVA__NEON_ZERO vdupq_n_f32(0.0f)
#define KVA__NEON_SET1(x) vdupq_n_f32(x)
#define KVA__NEON_ADD(a, b) vaddq_f32(a, b)
#define KVA__NEON_SUB(a, b) vsubq_f32(a, b)
#define KVA__NEON_MUL(a, b) vmulq_f32(a, b)
#define KVA__NEON_MIN(a, b) vminq_f32(a, b)
#define KVA__NEON_MAX(a, b) vmaxq_f32(a, b)
#define KVA__NEON_FMA(a, b, c) vfmaq_f32(c, a, b)
#define KVA__NEON_FNMA(a, b, c) vfmsq_f32(c, a, b)
#define KVA__NEON_MAX_IN(mx, v, m) vmaxq_f32(mx, v)
#define KVA__NEON_HSUM(v) vaddvq_f32(v)
#define KVA__NEON_HMAX(v) vmaxvq_f32(v)
#define KVA__NEON_ROUND(v) vrndnq_f32(v)
#define KVA__NEON_POW2(p, t) \
  vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), vshlq_n_s32(vcvtq_s32_f32(t), 23)))
#define KVA__NEON_KEEP_T uint32x4_t /* the lanes below lo, all bits set */
#define KVA__NEON_KEEP(v, lo, m) vcltq_f32(v, lo)
#define KVA__NEON_KEEP_ONLY(k, p) vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), k))
#define KVA__NEON_S_T float /* multiplied by element: no broadcast */
#define KVA__NEON_S(p, k) ((p)[k])
#define KVA__NEON_S_ZERO 0.0f
#define KVA__NEON_FMA_S(a, v, s) vfmaq_n_f32(a, v, s)

/* Scores: one key per step against up to four query rows. */
KVA__FORCEINLINE void kva__dot_tile_neon(const kva_dtype t, const float *const *q, const int nr,
                                         const void *const *krows, int nk, int d, float *scores, int lds,
                                         float fp8_scale, const kva__next_tile *next) {
  const float *q0 = q[0], *q1 = q[nr > 1 ? 1 : 0], *q2 = q[nr > 2 ? 2 : 0], *q3 = q[nr > 3 ? 3 : 0];
  int j, i, r;
  for (j = 0; j < nk; j++) {
    const void *k = krows[j];
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    float s[4];
    kva__prefetch_next(next, j);
    for (i = 0; i + 4 <= d; i += 4) {
      float32x4_t kv = kva__load4_neon(t, k, i);
      a0 = vfmaq_f32(a0, vld1q_f32(q0 + i), kv);
      if (nr > 1) a1 = vfmaq_f32(a1, vld1q_f32(q1 + i), kv);
      if (nr > 2) a2 = vfmaq_f32(a2, vld1q_f32(q2 + i), kv);
      if (nr > 3) a3 = vfmaq_f32(a3, vld1q_f32(q3 + i), kv);
    }
    s[0] = vaddvq_f32(a0);
    s[1] = vaddvq_f32(a1);
    s[2] = vaddvq_f32(a2);
    s[3] = vaddvq_f32(a3);
    for (; i < d; i++) {
      float kf = kva__load1(t, k, i);
      s[0] += q0[i] * kf;
      if (nr > 1) s[1] += q1[i] * kf;
      if (nr > 2) s[2] += q2[i] * kf;
      if (nr > 3) s[3] += q3[i] * kf;
    }
    if (kva__is_scaled(t)) {
      float ks = kva__row_scale(t, k, fp8_scale);
      for (r = 0; r < nr; r++) s[r] *= ks;
    }
    for (r = 0; r < nr; r++) scores[r * lds + j] = s[r];
  }
}

/* one strip of nv (<= 4) vectors of 4 columns from column i, nr rows (32 NEON
   registers hold the accumulators, the values and the scalars) */
KVA__FORCEINLINE void kva__vacc_strip_neon(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                           int ldp, const void *const *vrows, int nk, int i, const int nv, int dv) {
  KVA__VACC_STRIP(KVA__NEON_)
}
KVA__FORCEINLINE void kva__vacc_tile_neon(const kva_dtype t, float *const *acc, const int nr, const float *p,
                                          int ldp, const void *const *vrows, int nk, int dv, float fp8_scale) {
  float pbuf[KVA__NR * KVA__TILE];
  int j, i, r;
  p = kva__scale_probs(t, p, &ldp, nr, vrows, nk, fp8_scale, pbuf);
  for (i = 0; i + 16 <= dv; i += 16) kva__vacc_strip_neon(t, acc, nr, p, ldp, vrows, nk, i, 4, dv);
  if (dv - i >= 12) {
    kva__vacc_strip_neon(t, acc, nr, p, ldp, vrows, nk, i, 3, dv);
    i += 12;
  } else if (dv - i >= 8) {
    kva__vacc_strip_neon(t, acc, nr, p, ldp, vrows, nk, i, 2, dv);
    i += 8;
  } else if (dv - i >= 4) {
    kva__vacc_strip_neon(t, acc, nr, p, ldp, vrows, nk, i, 1, dv);
    i += 4;
  }
  for (; i < dv; i++)
    for (j = 0; j < nk; j++) {
      float vf = kva__load1(t, vrows[j], i);
      for (r = 0; r < nr; r++) acc[r][i] += p[r * ldp + j] * vf;
    }
}

static inline float kva__exp_sub_sum_neon(float *x, int n, float m) { KVA__EXP_SUB_SUM(KVA__NEON_) }
static inline float kva__scale_max_neon(float *x, int n, float scale) { KVA__SCALE_MAX(KVA__NEON_) }
static inline void kva__block_bound_neon(const float *const *q, int nr, const uint16_t *lohi, int d, float *bound) {
  KVA__BLOCK_BOUND(KVA__NEON_)
}

static inline float kva__dot_f32_neon(const float *a, const float *b, int n) {
  float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;
  float t;
  int i;
  for (i = 0; i + 8 <= n; i += 8) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  t = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; i++) t += a[i] * b[i];
  return t;
}

static inline void kva__f32_to_f16_row_neon(uint16_t *dst, const float *src, int n) {
  int i;
  for (i = 0; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
  for (; i < n; i++) dst[i] = kva_f32_to_f16(src[i]);
}

/* 4 codes per step, bit-identical to the scalar encoder (see kva__fp8_format) */
KVA__FORCEINLINE uint16x4_t kva__fp8_encode4_neon(float32x4_t v, const kva__fp8_format *f, int32x4_t neg_shift) {
  uint32x4_t x = vreinterpretq_u32_f32(v), a = vandq_u32(x, vdupq_n_u32(0x7fffffffu)), code, sub, norm;
  float32x4_t magic = vreinterpretq_f32_u32(vdupq_n_u32(f->magic));
  sub = vsubq_u32(vreinterpretq_u32_f32(vaddq_f32(vreinterpretq_f32_u32(a), magic)), vdupq_n_u32(f->magic));
  norm = vaddq_u32(vaddq_u32(a, vdupq_n_u32((1u << (f->shift - 1)) - 1u)),
                   vandq_u32(vshlq_u32(a, neg_shift), vdupq_n_u32(1)));
  norm = vminq_u32(vshlq_u32(vsubq_u32(norm, vdupq_n_u32(f->rebias)), neg_shift), vdupq_n_u32(f->max_code));
  code = vbslq_u32(vcltq_u32(a, vdupq_n_u32(f->min_normal)), sub, norm);
  code = vbslq_u32(vcgtq_u32(a, vdupq_n_u32(0x7f800000u)), vdupq_n_u32(f->nan_code), code);
  code = vorrq_u32(code, vandq_u32(vshrq_n_u32(x, 24), vdupq_n_u32(0x80)));
  return vmovn_u32(code);
}
static inline void kva__fp8_encode_neon(uint8_t *dst, const float *src, size_t n, float mul,
                                        const kva__fp8_format *f) {
  const int32x4_t neg_shift = vdupq_n_s32(-f->shift);
  size_t i;
  for (i = 0; i + 8 <= n; i += 8) {
    uint16x4_t lo = kva__fp8_encode4_neon(vmulq_n_f32(vld1q_f32(src + i), mul), f, neg_shift);
    uint16x4_t hi = kva__fp8_encode4_neon(vmulq_n_f32(vld1q_f32(src + i + 4), mul), f, neg_shift);
    vst1_u8(dst + i, vmovn_u16(vcombine_u16(lo, hi)));
  }
  kva__fp8_encode_scalar(dst + i, src + i, n - i, mul, f);
}
/* --- integer scores: SDOT (signed bytes, four products into each 32-bit
   lane) when the compiler targets the dot-product extension; without it,
   widening multiplies and pairwise adds give the same sums (a pair of
   products stays within 2 * 127 * 128, which fits 16 bits). --- */
KVA__FORCEINLINE int32x4_t kva__sdot_neon(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  p = vmlal_s8(p, vget_high_s8(a), vget_high_s8(b));
  return vpadalq_s16(acc, p);
#endif
}

/* One key per step against up to four query rows; whole groups of 32 in vectors. */
KVA__FORCEINLINE void kva__idot_tile_neon(const kva_dtype t, const kva__qrow *q, const int nr,
                                          const void *const *krows, int nk, int d, float *scores, int lds,
                                          const kva__next_tile *next) {
  const int full = d / 32 * 32;
  const int8_t *qc[4];
  int j, i, r;
  for (r = 0; r < 4; r++) qc[r] = q[nr > r ? r : 0].codes;
  for (j = 0; j < nk; j++) {
    const uint8_t *k = (const uint8_t *)krows[j];
    kva__prefetch_next(next, j);
    if (t == KVA_INT8) {
      int32x4_t a0 = vdupq_n_s32(0), a1 = a0, a2 = a0, a3 = a0;
      float ks = kva__row_scale(KVA_INT8, k, 1.0f);
      for (i = 0; i < full; i += 16) {
        int8x16_t kv = vld1q_s8((const int8_t *)k + i);
        a0 = kva__sdot_neon(a0, kv, vld1q_s8(qc[0] + i));
        if (nr > 1) a1 = kva__sdot_neon(a1, kv, vld1q_s8(qc[1] + i));
        if (nr > 2) a2 = kva__sdot_neon(a2, kv, vld1q_s8(qc[2] + i));
        if (nr > 3) a3 = kva__sdot_neon(a3, kv, vld1q_s8(qc[3] + i));
      }
      for (r = 0; r < nr; r++) {
        int32x4_t a = r == 0 ? a0 : r == 1 ? a1 : r == 2 ? a2 : a3;
        int32_t s = vaddvq_s32(a) + kva__idot_i8_rest(qc[r], (const int8_t *)k, full, d);
        scores[r * lds + j] = (float)s * (q[r].scale * ks);
      }
    } else { /* INT4: per lane gscale * dot in float, the minimums' part per row */
      float32x4_t f0 = vdupq_n_f32(0.0f), f1 = f0, f2 = f0, f3 = f0;
      float mins[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      int g;
      for (g = 0, i = 0; i < full; g++, i += 32) {
        float s, mn;
        uint8x16_t b = vld1q_u8(kva__i4_group(k, i, &s, &mn));
        int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
        const int32x4_t z = vdupq_n_s32(0);
        f0 = vfmaq_n_f32(f0, vcvtq_f32_s32(kva__sdot_neon(kva__sdot_neon(z, lo, vld1q_s8(qc[0] + i)), hi, vld1q_s8(qc[0] + i + 16))), s);
        if (nr > 1)
          f1 = vfmaq_n_f32(f1, vcvtq_f32_s32(kva__sdot_neon(kva__sdot_neon(z, lo, vld1q_s8(qc[1] + i)), hi, vld1q_s8(qc[1] + i + 16))), s);
        if (nr > 2)
          f2 = vfmaq_n_f32(f2, vcvtq_f32_s32(kva__sdot_neon(kva__sdot_neon(z, lo, vld1q_s8(qc[2] + i)), hi, vld1q_s8(qc[2] + i + 16))), s);
        if (nr > 3)
          f3 = vfmaq_n_f32(f3, vcvtq_f32_s32(kva__sdot_neon(kva__sdot_neon(z, lo, vld1q_s8(qc[3] + i)), hi, vld1q_s8(qc[3] + i + 16))), s);
        for (r = 0; r < nr; r++) mins[r] += mn * (float)q[r].gsum[g];
      }
      for (r = 0; r < nr; r++) {
        float32x4_t f = r == 0 ? f0 : r == 1 ? f1 : r == 2 ? f2 : f3;
        scores[r * lds + j] = q[r].scale * (vaddvq_f32(f) + mins[r] + kva__idot_i4_rest(&q[r], k, g, d));
      }
    }
  }
}

/* --- integer values (the scalar twin says what): zips keep the channels
   in order. The products take unsigned bytes, so INT8 codes are biased by
   128 in the interleave and 128 * sum(u) comes off each sum at the end;
   with the dot-product extension UDOT adds four products per lane, else
   widening multiplies and pairwise adds do (one row per call: the
   accumulators of two keys' halves take twice the registers). --- */
KVA__FORCEINLINE void kva__iv_codes32_neon(const uint8_t *p, const int i4, uint8x16_t *lo, uint8x16_t *hi) {
  if (i4) {
    const uint8x16_t b = vld1q_u8(p), l = vandq_u8(b, vdupq_n_u8(15)), h = vshrq_n_u8(b, 4);
    *lo = vzip1q_u8(l, h);
    *hi = vzip2q_u8(l, h);
  } else {
    *lo = veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80));
    *hi = veorq_u8(vld1q_u8(p + 16), vdupq_n_u8(0x80));
  }
}
KVA__FORCEINLINE void kva__ilv4_neon(uint8_t *dst, const uint8_t *const *rows, const int i4) {
  uint8x16_t a[4][2];
  int k, h;
  for (k = 0; k < 4; k++) kva__iv_codes32_neon(rows[k], i4, &a[k][0], &a[k][1]);
  for (h = 0; h < 2; h++) {
    const uint16x8_t lo01 = vreinterpretq_u16_u8(vzip1q_u8(a[0][h], a[1][h]));
    const uint16x8_t hi01 = vreinterpretq_u16_u8(vzip2q_u8(a[0][h], a[1][h]));
    const uint16x8_t lo23 = vreinterpretq_u16_u8(vzip1q_u8(a[2][h], a[3][h]));
    const uint16x8_t hi23 = vreinterpretq_u16_u8(vzip2q_u8(a[2][h], a[3][h]));
    vst1q_u8(dst + 64 * h, vreinterpretq_u8_u16(vzip1q_u16(lo01, lo23)));
    vst1q_u8(dst + 64 * h + 16, vreinterpretq_u8_u16(vzip2q_u16(lo01, lo23)));
    vst1q_u8(dst + 64 * h + 32, vreinterpretq_u8_u16(vzip1q_u16(hi01, hi23)));
    vst1q_u8(dst + 64 * h + 48, vreinterpretq_u8_u16(vzip2q_u16(hi01, hi23)));
  }
}
KVA__FORCEINLINE void kva__iprod_neon(float *out, const uint8_t *ilv, int nk4, const uint8_t *u, int ldu,
                                      const int nr, const int i4) {
  int j, k, r;
  for (r = 0; r < nr; r++) {
    const uint8_t *x = ilv, *ur = u + r * ldu;
    uint32_t usum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
    uint32x4_t a[8];
    for (k = 0; k < 8; k++) a[k] = vdupq_n_u32(0);
    for (j = 0; j < nk4; j += 4, x += KVA__IV_BYTES) {
      const uint8x16_t ub = vreinterpretq_u8_s32(vdupq_n_s32(kva__iv_u4(ur + j)));
      for (k = 0; k < 8; k++) a[k] = vdotq_u32(a[k], vld1q_u8(x + 16 * k), ub);
    }
#else
    uint32x4_t a[8], pa[8], pb[8];
    for (k = 0; k < 8; k++) pa[k] = pb[k] = vdupq_n_u32(0);
    for (j = 0; j < nk4; j += 4, x += KVA__IV_BYTES) {
      const uint8x8_t ub = vreinterpret_u8_s32(vdup_n_s32(kva__iv_u4(ur + j)));
      for (k = 0; k < 8; k++) { /* lanes of pa: (channel 4k, keys 0-1), (4k, 2-3), (4k + 1, 0-1), (4k + 1, 2-3) */
        const uint8x16_t xk = vld1q_u8(x + 16 * k);
        pa[k] = vpadalq_u16(pa[k], vmull_u8(vget_low_u8(xk), ub));
        pb[k] = vpadalq_u16(pb[k], vmull_u8(vget_high_u8(xk), ub));
      }
    }
    for (k = 0; k < 8; k++) a[k] = vpaddq_u32(pa[k], pb[k]);
#endif
    if (!i4)
      for (j = 0; j < nk4; j++) usum += ur[j];
    for (k = 0; k < 8; k++)
      vst1q_f32(out + r * KVA__IV_CH + 4 * k,
                vcvtq_f32_s32(vreinterpretq_s32_u32(vsubq_u32(a[k], vdupq_n_u32(128u * usum)))));
  }
}

/* --- rotation --- */
/* the same butterflies in 4 lanes: distances 1 and 2 inside each vector, then whole vectors */
KVA__FORCEINLINE float32x4_t kva__fwht4_stage_neon(float32x4_t v, float32x4_t partner, uint32x4_t upper) {
  return vbslq_f32(upper, vsubq_f32(partner, v), vaddq_f32(v, partner));
}
static inline void kva__fwht_neon(float *x, int n) {
  static const uint32_t odd[4] = {0, 0xffffffffu, 0, 0xffffffffu}, high[4] = {0, 0, 0xffffffffu, 0xffffffffu};
  const float32x4_t s = vdupq_n_f32((float)(1.0 / sqrt((double)n)));
  int h, i, j;
  if (n < 4) {
    kva__fwht_scalar(x, n);
    return;
  }
  for (i = 0; i < n; i += 4) {
    float32x4_t v = vld1q_f32(x + i);
    v = kva__fwht4_stage_neon(v, vrev64q_f32(v), vld1q_u32(odd));
    v = kva__fwht4_stage_neon(v, vextq_f32(v, v, 2), vld1q_u32(high));
    vst1q_f32(x + i, v);
  }
  KVA__FWHT_WIDE(KVA__NEON_);
}
#endif /* NEON */

/* ---- the kernel table: every kernel the rest of the library calls, per ISA ----
   Kernels are chosen here and nowhere else (as xxhash.h's dispatch block):
   each ISA names, for every entry point, its own kernel or, where it has
   none, the one it falls back to (AVX-512 -> AVX2 -> scalar). Two choices
   are made inside a kernel, by the compiler's target: the AVX2 integer
   kernel's byte products (KVA__DPBUSD256: VNNI's vpdpbusd with AVX512-VNNI
   + VL or AVX-VNNI, else maddubs + madd) and NEON's (kva__sdot_neon: SDOT
   with the dot-product extension, else widening multiplies and pairwise
   adds); both give the same integers. A new ISA (SVE, AVX10) adds its
   kernels in a block above and a block here.

   The entry points (the type dispatchers below wrap the first four):
     kva__dot_tile_isa    scores of up to four query rows
     kva__wdot_tile_isa   scores of a pass of KVA__WIDE_ROWS rows and more,
                          keys along the lanes; KVA__WIDE_ROWS is where it
                          pays for its transposes (measured: bench speed
                          --parts prefill), above KVA__MAXROWS where an ISA
                          has none
     kva__vacc_tile_isa   probabilities times values, added to the output rows
     kva__idot_tile_isa   integer scores (kva_attn.int_scores)
     kva__ilv4_isa, kva__iprod_isa   integer values (kva_attn.int_values):
                          four keys' codes interleaved, and their products
                          with KVA__IV_ROWS rows' probability codes at a time
     kva__exp_sub_sum, kva__scale_max, kva__dot_f32          softmax and dot product
     kva__block_bound     a block's score bound (kva_attn.select_budget)
     kva__f32_to_f16_row, kva__fp8_encode, kva__i4_encode    storing rows ([5])
     kva__fwht            the rotation (kva_cache_desc.rotate, [9])
   and KVA__ISA_NAME, what kva_simd_name() reports. */
#if KVATTN_SIMD == KVA_SIMD_AVX512
#define KVA__ISA_NAME "avx512"
#define kva__dot_tile_isa kva__dot_tile_avx512
#define kva__wdot_tile_isa kva__wdot_tile_avx512
#define KVA__WIDE_ROWS 24
#define kva__vacc_tile_isa kva__vacc_tile_avx512
#define kva__idot_tile_isa kva__idot_tile_avx2 /* 256-bit, VNNI through VL */
#define kva__ilv4_isa kva__ilv4_avx2
#if defined(__AVX512VNNI__)
#define kva__iprod_isa kva__iprod_avx512
#else
#define kva__iprod_isa kva__iprod_avx2
#endif
#define KVA__IV_ROWS 4 /* 16 (or 8) accumulators of 32 registers */
#define kva__exp_sub_sum kva__exp_sub_sum_avx512
#define kva__scale_max kva__scale_max_avx512
#define kva__block_bound kva__block_bound_avx512
#define kva__dot_f32 kva__dot_f32_avx2
#define kva__f32_to_f16_row kva__f32_to_f16_row_avx2
#define kva__fp8_encode kva__fp8_encode_avx2
#define kva__i4_encode kva__i4_encode_avx2
#define kva__fwht kva__fwht_avx2
#elif KVATTN_SIMD == KVA_SIMD_AVX2
#define KVA__ISA_NAME "avx2"
#define kva__dot_tile_isa kva__dot_tile_avx2
#define kva__wdot_tile_isa kva__wdot_tile_scalar /* never runs: */
#define KVA__WIDE_ROWS (KVA__MAXROWS + 1)        /* no pass is this wide */
#define kva__vacc_tile_isa kva__vacc_tile_avx2
#define kva__idot_tile_isa kva__idot_tile_avx2
#define kva__ilv4_isa kva__ilv4_avx2
#define kva__iprod_isa kva__iprod_avx2
#define KVA__IV_ROWS 2 /* 8 accumulators of 16 registers */
#define kva__exp_sub_sum kva__exp_sub_sum_avx2
#define kva__scale_max kva__scale_max_avx2
#define kva__block_bound kva__block_bound_avx2
#define kva__dot_f32 kva__dot_f32_avx2
#define kva__f32_to_f16_row kva__f32_to_f16_row_avx2
#define kva__fp8_encode kva__fp8_encode_avx2
#define kva__i4_encode kva__i4_encode_avx2
#define kva__fwht kva__fwht_avx2
#elif KVATTN_SIMD == KVA_SIMD_NEON /* with or without the dot-product extension */
#define KVA__ISA_NAME "neon"
#define kva__dot_tile_isa kva__dot_tile_neon
#define kva__wdot_tile_isa kva__wdot_tile_scalar /* never runs: */
#define KVA__WIDE_ROWS (KVA__MAXROWS + 1)        /* no pass is this wide */
#define kva__vacc_tile_isa kva__vacc_tile_neon
#define kva__idot_tile_isa kva__idot_tile_neon /* SDOT, or its widening twin */
#define kva__ilv4_isa kva__ilv4_neon
#define kva__iprod_isa kva__iprod_neon /* UDOT, or its widening twin */
#define KVA__IV_ROWS 2
#define kva__exp_sub_sum kva__exp_sub_sum_neon
#define kva__scale_max kva__scale_max_neon
#define kva__block_bound kva__block_bound_neon
#define kva__dot_f32 kva__dot_f32_neon
#define kva__f32_to_f16_row kva__f32_to_f16_row_neon
#define kva__fp8_encode kva__fp8_encode_neon
#define kva__i4_encode kva__i4_encode_scalar
#define kva__fwht kva__fwht_neon
#else
#define KVA__ISA_NAME "scalar"
#define kva__dot_tile_isa kva__dot_tile_scalar
#define kva__wdot_tile_isa kva__wdot_tile_scalar /* never runs: */
#define KVA__WIDE_ROWS (KVA__MAXROWS + 1)        /* no pass is this wide */
#define kva__vacc_tile_isa kva__vacc_tile_scalar
#define kva__idot_tile_isa kva__idot_tile_scalar
#define kva__ilv4_isa kva__ilv4_scalar
#define kva__iprod_isa kva__iprod_scalar
#define KVA__IV_ROWS 4
#define kva__exp_sub_sum kva__exp_sub_sum_scalar
#define kva__scale_max kva__scale_max_scalar
#define kva__block_bound kva__block_bound_scalar
#define kva__dot_f32 kva__dot_f32_scalar
#define kva__f32_to_f16_row kva__f32_to_f16_row_scalar
#define kva__fp8_encode kva__fp8_encode_scalar
#define kva__i4_encode kva__i4_encode_scalar
#define kva__fwht kva__fwht_scalar
#endif

KVA_API const char *kva_simd_name(void) { return KVA__ISA_NAME; }

/* The row-count dispatchers: the selected kernel specialised for 1..4 rows. */
KVA__FORCEINLINE void kva__dot_tile_rows(const kva_dtype t, const float *const *q, int nr, const void *const *krows,
                                         int nk, int d, float *scores, int lds, float fp8_scale,
                                         const kva__next_tile *next) {
  switch (nr) {
    case 1: kva__dot_tile_isa(t, q, 1, krows, nk, d, scores, lds, fp8_scale, next); break;
    case 2: kva__dot_tile_isa(t, q, 2, krows, nk, d, scores, lds, fp8_scale, next); break;
    case 3: kva__dot_tile_isa(t, q, 3, krows, nk, d, scores, lds, fp8_scale, next); break;
    default: kva__dot_tile_isa(t, q, 4, krows, nk, d, scores, lds, fp8_scale, next); break;
  }
}
KVA__FORCEINLINE void kva__vacc_tile_rows(const kva_dtype t, float *const *acc, int nr, const float *p, int ldp,
                                          const void *const *vrows, int nk, int dv, float fp8_scale) {
  switch (nr) {
    case 1: kva__vacc_tile_isa(t, acc, 1, p, ldp, vrows, nk, dv, fp8_scale); break;
    case 2: kva__vacc_tile_isa(t, acc, 2, p, ldp, vrows, nk, dv, fp8_scale); break;
    case 3: kva__vacc_tile_isa(t, acc, 3, p, ldp, vrows, nk, dv, fp8_scale); break;
    default: kva__vacc_tile_isa(t, acc, 4, p, ldp, vrows, nk, dv, fp8_scale); break;
  }
}

/* One entry point per storage type with the type constant (so a profile
   names the type): kva__dot_tile_f16, kva__vacc_tile_f16, ... */
#define KVA__TILE_KERNELS_FOR(stem, T)                                                                       \
  static inline void kva__dot_tile_##stem(const float *const *q, int nr, const void *const *krows, int nk,    \
                                          int d, float *scores, int lds, float fp8_scale,                     \
                                          const kva__next_tile *next) {                                       \
    if (nr > KVA__NR) kva__wdot_tile_isa(T, q, nr, krows, nk, d, scores, lds, fp8_scale, next);               \
    else kva__dot_tile_rows(T, q, nr, krows, nk, d, scores, lds, fp8_scale, next);                            \
  }                                                                                                          \
  static inline void kva__vacc_tile_##stem(float *const *acc, int nr, const float *p, int ldp,                \
                                           const void *const *vrows, int nk, int dv, float fp8_scale) {       \
    kva__vacc_tile_rows(T, acc, nr, p, ldp, vrows, nk, dv, fp8_scale);                                        \
  }
KVA__TILE_KERNELS_FOR(f32, KVA_F32)
KVA__TILE_KERNELS_FOR(f16, KVA_F16)
KVA__TILE_KERNELS_FOR(bf16, KVA_BF16)
KVA__TILE_KERNELS_FOR(i8, KVA_INT8)
KVA__TILE_KERNELS_FOR(e4m3, KVA_FP8_E4M3)
KVA__TILE_KERNELS_FOR(e5m2, KVA_FP8_E5M2)
KVA__TILE_KERNELS_FOR(i4, KVA_INT4)

/* Dispatch on the storage type once per tile. kva__dot_tile takes up to
   KVA__NR rows to the four-row kernel, more to the many-row one. */
static inline void kva__dot_tile(kva_dtype t, const float *const *q, int nr, const void *const *krows, int nk,
                                 int d, float *scores, int lds, float fp8_scale, const kva__next_tile *next) {
  switch (t) {
    case KVA_F32: kva__dot_tile_f32(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_F16: kva__dot_tile_f16(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_BF16: kva__dot_tile_bf16(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_INT8: kva__dot_tile_i8(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_FP8_E4M3: kva__dot_tile_e4m3(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_FP8_E5M2: kva__dot_tile_e5m2(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    case KVA_INT4: kva__dot_tile_i4(q, nr, krows, nk, d, scores, lds, fp8_scale, next); break;
    default: KVATTN_ASSERT(0); break;
  }
}
static inline void kva__vacc_tile(kva_dtype t, float *const *acc, int nr, const float *p, int ldp,
                                  const void *const *vrows, int nk, int dv, float fp8_scale) {
  switch (t) {
    case KVA_F32: kva__vacc_tile_f32(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_F16: kva__vacc_tile_f16(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_BF16: kva__vacc_tile_bf16(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_INT8: kva__vacc_tile_i8(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_FP8_E4M3: kva__vacc_tile_e4m3(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_FP8_E5M2: kva__vacc_tile_e5m2(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    case KVA_INT4: kva__vacc_tile_i4(acc, nr, p, ldp, vrows, nk, dv, fp8_scale); break;
    default: KVATTN_ASSERT(0); break;
  }
}


KVA__FORCEINLINE void kva__idot_tile_rows(const kva_dtype t, const kva__qrow *q, int nr, const void *const *krows,
                                          int nk, int d, float *scores, int lds, const kva__next_tile *next) {
  switch (nr) {
    case 1: kva__idot_tile_isa(t, q, 1, krows, nk, d, scores, lds, next); break;
    case 2: kva__idot_tile_isa(t, q, 2, krows, nk, d, scores, lds, next); break;
    case 3: kva__idot_tile_isa(t, q, 3, krows, nk, d, scores, lds, next); break;
    default: kva__idot_tile_isa(t, q, 4, krows, nk, d, scores, lds, next); break;
  }
}
static inline void kva__idot_tile_i8(const kva__qrow *q, int nr, const void *const *krows, int nk, int d,
                                     float *scores, int lds, const kva__next_tile *next) {
  kva__idot_tile_rows(KVA_INT8, q, nr, krows, nk, d, scores, lds, next);
}
static inline void kva__idot_tile_i4(const kva__qrow *q, int nr, const void *const *krows, int nk, int d,
                                     float *scores, int lds, const kva__next_tile *next) {
  kva__idot_tile_rows(KVA_INT4, q, nr, krows, nk, d, scores, lds, next);
}
/* Scores of nr (<= 4) quantized query rows against nk INT8 or INT4 keys. */
static inline void kva__idot_tile(kva_dtype t, const kva__qrow *q, int nr, const void *const *krows, int nk, int d,
                                  float *scores, int lds, const kva__next_tile *next) {
  if (t == KVA_INT8) kva__idot_tile_i8(q, nr, krows, nk, d, scores, lds, next);
  else kva__idot_tile_i4(q, nr, krows, nk, d, scores, lds, next);
}

/* Integer values: the probability codes of one row over nk keys from its
   weights w (p_j times the key's scale, the scale of its group for INT4),
   zero past nk up to a multiple of 4; returns W / 255. Loops the compiler
   vectorises. A NaN weight
   makes the returned factor NaN (its code does not matter then), so that
   the row's output is NaN. */
static inline float kva__iv_codes(float *w, int nk, uint8_t *u) {
  float top = 0.0f, inv;
  int j, nan = 0;
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  /* (plain loops, not the ISA's scale_max: g++ 12 misreports the AVX-512
     reduction's undefined lanes as uninitialised once its result is used;
     eight partial maxima, as one vector, so that each step does not wait
     for the last: one chain cost a tile as much as its value products) */
  for (j = 0; j + 8 <= nk; j += 8) {
    int k;
    for (k = 0; k < 8; k++) part[k] = w[j + k] > part[k] ? w[j + k] : part[k];
  }
  for (; j < nk; j++) part[0] = w[j] > part[0] ? w[j] : part[0];
  for (j = 0; j < 8; j++) top = part[j] > top ? part[j] : top;
  memset(u + nk, 0, (size_t)(((nk + 3) & ~3) - nk));
  if (!(top > 0.0f)) { /* all zero (or NaN) */
    for (j = 0; j < nk; j++) {
      nan |= w[j] != w[j];
      u[j] = 0;
    }
    return top == 0.0f && !nan ? 0.0f : NAN;
  }
  inv = 255.0f / top;
  if (inv <= FLT_MAX)
    for (j = 0; j < nk; j++) {
      float x = w[j] * inv + 0.5f;
      nan |= x != x;
      x = x < 255.0f ? x : 255.0f;
      u[j] = (uint8_t)(int)(x > 0.0f ? x : 0.0f);
    }
  else /* a tile far below the row's maximum (weights near FLT_MIN): 255 / top overflows */
    for (j = 0; j < nk; j++) {
      float x = w[j] / top * 255.0f + 0.5f;
      nan |= x != x;
      x = x < 255.0f ? x : 255.0f;
      u[j] = (uint8_t)(int)(x > 0.0f ? x : 0.0f);
    }
  return nan ? NAN : top / 255.0f;
}
KVA__FORCEINLINE void kva__iprod_rows(float *out, const uint8_t *ilv, int nk4, const uint8_t *u, int ldu, int nr,
                                      const int i4) {
  switch (nr) {
    case 1: kva__iprod_isa(out, ilv, nk4, u, ldu, 1, i4); break;
#if KVA__IV_ROWS >= 2
    case 2: kva__iprod_isa(out, ilv, nk4, u, ldu, 2, i4); break;
#endif
#if KVA__IV_ROWS >= 4
    case 3: kva__iprod_isa(out, ilv, nk4, u, ldu, 3, i4); break;
    case 4: kva__iprod_isa(out, ilv, nk4, u, ldu, 4, i4); break;
#endif
    default: KVATTN_ASSERT(0); break;
  }
}
/* acc_r += the tile's values weighted by p (rows r < nr <= KVA__MAXROWS,
   p[r * ldp + j], keys j < nk <= KVA__TILE) with integer products: the
   function stated at the scalar twins. Steps of KVA__IV_CH channels; a
   last, narrower step reads its keys' codes through a zero-padded copy. */
KVA__FORCEINLINE void kva__ivacc_tile_with(const int i4, float *const *acc, int nr, const float *p, int ldp,
                                           const void *const *vrows, int nk, int dv) {
  uint8_t KVA__ALIGN(64) ilv[KVA__TILE * KVA__IV_CH];
  uint8_t KVA__ALIGN(64) u[KVA__MAXROWS * KVA__TILE];
  uint8_t pad[KVA__TILE + 3][KVA__IV_CH];
  float KVA__ALIGN(64) prod[KVA__IV_ROWS * KVA__IV_CH];
  float KVA__ALIGN(64) w[KVA__TILE];
  float unit[KVA__MAXROWS], gmin[KVA__TILE], sc[KVA__TILE], msum[KVA__MAXROWS];
  const uint8_t *src[KVA__TILE + 3];
  const int nk4 = (nk + 3) & ~3;
  int c0, r, j, c;
  if (!i4) { /* one scale per key: the codes serve every channel */
    for (j = 0; j < nk; j++) sc[j] = kva__row_scale(KVA_INT8, vrows[j], 1.0f);
    for (r = 0; r < nr; r++) {
      const float *pr = p + r * ldp;
      for (j = 0; j < nk; j++) w[j] = pr[j] * sc[j];
      unit[r] = kva__iv_codes(w, nk, u + r * KVA__TILE);
      msum[r] = 0.0f;
    }
  }
  for (c0 = 0; c0 < dv; c0 += KVA__IV_CH) {
    const int n = dv - c0 < KVA__IV_CH ? dv - c0 : KVA__IV_CH;
    for (j = 0; j < nk; j++)
      src[j] = i4 ? kva__i4_group(vrows[j], c0, &sc[j], &gmin[j]) : (const uint8_t *)vrows[j] + c0;
    if (n < KVA__IV_CH) { /* the row ends inside the step */
      memset(pad, 0, sizeof pad);
      for (j = 0; j < nk; j++) memcpy(pad[j], src[j], i4 ? (size_t)(n + 1) / 2 : (size_t)n), src[j] = pad[j];
    }
    for (j = nk; j < nk4; j++) src[j] = src[0]; /* keys with code 0 */
    if (i4) /* each group has its own scales: its own codes */
      for (r = 0; r < nr; r++) {
        const float *pr = p + r * ldp;
        for (j = 0; j < nk; j++) w[j] = pr[j] * sc[j];
        unit[r] = kva__iv_codes(w, nk, u + r * KVA__TILE);
        msum[r] = kva__dot_f32(pr, gmin, nk);
      }
    for (j = 0; j < nk4; j += 4) kva__ilv4_isa(ilv + (size_t)j * KVA__IV_CH, src + j, i4);
    for (r = 0; r < nr; r += KVA__IV_ROWS) {
      const int rows = nr - r < KVA__IV_ROWS ? nr - r : KVA__IV_ROWS;
      int rr;
      kva__iprod_rows(prod, ilv, nk4, u + r * KVA__TILE, KVA__TILE, rows, i4);
      for (rr = 0; rr < rows; rr++) {
        float *a = acc[r + rr] + c0;
        const float f = unit[r + rr], m = msum[r + rr], *x = prod + rr * KVA__IV_CH;
        for (c = 0; c < n; c++) a[c] += f * x[c] + m;
      }
    }
  }
}
static inline void kva__ivacc_tile(kva_dtype t, float *const *acc, int nr, const float *p, int ldp,
                                   const void *const *vrows, int nk, int dv) {
  if (t == KVA_INT4) kva__ivacc_tile_with(1, acc, nr, p, ldp, vrows, nk, dv);
  else kva__ivacc_tile_with(0, acc, nr, p, ldp, vrows, nk, dv);
}
KVA__FORCEINLINE int kva__int_valued(kva_dtype vt) { return vt == KVA_INT8 || vt == KVA_INT4; }

/* ======================================================================
   [5] quantization: FP8 bulk conversions and scale calibration, INT8 and
       INT4 rows, storing and loading one cache row
   ====================================================================== */
/* Bulk FP8 conversions: element for element what kva_f32_to_e4m3 (and the
   others) give, the encoders vectorised (they are the cache's store path). */
KVA_API void kva_f32_to_e4m3_n(uint8_t *dst, const float *src, size_t n) {
  if (n > 0) kva__fp8_encode(dst, src, n, 1.0f, &kva__e4m3_format);
}
KVA_API void kva_f32_to_e5m2_n(uint8_t *dst, const float *src, size_t n) {
  if (n > 0) kva__fp8_encode(dst, src, n, 1.0f, &kva__e5m2_format);
}
KVA_API void kva_e4m3_to_f32_n(float *dst, const uint8_t *src, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) dst[i] = kva_e4m3_to_f32(src[i]);
}
KVA_API void kva_e5m2_to_f32_n(float *dst, const uint8_t *src, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) dst[i] = kva_e5m2_to_f32(src[i]);
}


/* A calibration sample: n_rows rows of row_len floats, row r at x + r * stride
   (one head of [tokens][heads][head_dim] data, or one flat array). */
typedef struct {
  const float *x;
  size_t n_rows, row_len, stride;
} kva__sample;

/* Round-trip squared error of the sample's finite values under `scale`, the
   store path's vector encoder doing the encoding. */
static inline double kva__fp8_sq_error(const kva__fp8_format *f, const float *decode, const kva__sample *x,
                                       float scale) {
  uint8_t codes[1024];
  float inv = 1.0f / scale;
  double err = 0.0;
  size_t r, i0, i;
  for (r = 0; r < x->n_rows; r++) {
    const float *row = x->x + r * x->stride;
    for (i0 = 0; i0 < x->row_len; i0 += sizeof codes) {
      size_t m = x->row_len - i0 < sizeof codes ? x->row_len - i0 : sizeof codes;
      kva__fp8_encode(codes, row + i0, m, inv, f);
      for (i = 0; i < m; i++) {
        double d = (double)decode[codes[i]] * (double)scale - (double)row[i0 + i];
        if (fabsf(row[i0 + i]) <= FLT_MAX) err += d * d;
      }
    }
  }
  return err;
}

static inline float kva__fp8_choose_scale(kva_dtype t, const kva__sample *x, kva_calib rule) {
  float amax = 0.0f, fmax = t == KVA_FP8_E4M3 ? 448.0f : 57344.0f, s;
  size_t r, i;
  for (r = 0; r < x->n_rows; r++)
    for (i = 0; i < x->row_len; i++) {
      float a = fabsf(x->x[r * x->stride + i]);
      if (a > amax && a <= FLT_MAX) amax = a;
    }
  if (amax == 0.0f) return 1.0f;
  switch (rule) {
    case KVA_CALIB_VLLM_K: s = amax / 200.0f; break;
    case KVA_CALIB_VLLM_V: s = amax / 100.0f; break;
    case KVA_CALIB_ABSMAX: s = amax / fmax; break;
    default: {
      const kva__fp8_format *f = t == KVA_FP8_E4M3 ? &kva__e4m3_format : &kva__e5m2_format;
      float decode[256];
      double best = -1.0;
      int k;
      for (k = 0; k < 256; k++) decode[k] = t == KVA_FP8_E4M3 ? kva_e4m3_to_f32((uint8_t)k) : kva_e5m2_to_f32((uint8_t)k);
      s = amax / fmax;
      for (k = -2; k <= 40; k++) { /* k -2, -1: vLLM's two scales; then ABSMAX's x 2^(-k/8) */
        float c = k == -2 ? amax / 200.0f : k == -1 ? amax / 100.0f : (float)((double)amax / (double)fmax * pow(2.0, -k / 8.0));
        double e;
        if (!(c >= FLT_MIN)) continue;
        e = kva__fp8_sq_error(f, decode, x, c);
        if (best < 0.0 || e < best) {
          best = e;
          s = c;
        }
      }
      break;
    }
  }
  if (!(s >= FLT_MIN)) s = FLT_MIN; /* a subnormal sample */
  if (t == KVA_FP8_E4M3 && s > FLT_MAX / 512.0f) s = FLT_MAX / 512.0f; /* the kernels fold x256 into it */
  return s;
}

static inline int kva__calib_args_ok(kva_dtype t, kva_calib rule) {
  return (t == KVA_FP8_E4M3 || t == KVA_FP8_E5M2) && (rule == KVA_CALIB_MSE || rule == KVA_CALIB_ABSMAX ||
                                                      rule == KVA_CALIB_VLLM_K || rule == KVA_CALIB_VLLM_V);
}

KVA_API kva_status kva_fp8_calibrate(kva_dtype t, const float *x, size_t n, kva_calib rule, float *scale) {
  kva__sample sample;
  if (!scale || !kva__calib_args_ok(t, rule) || (n > 0 && !x)) return KVA_ERR_ARG;
  sample.x = x, sample.n_rows = 1, sample.row_len = n, sample.stride = n;
  *scale = kva__fp8_choose_scale(t, &sample, rule);
  return KVA_OK;
}

KVA_API kva_status kva_fp8_calibrate_heads(kva_dtype t, const float *x, int n_tokens, int n_heads, int head_dim,
                                           kva_calib rule, float *scales) {
  kva__sample sample;
  int h;
  if (!scales || !kva__calib_args_ok(t, rule) || n_tokens < 0 || n_heads <= 0 || head_dim <= 0 ||
      (n_tokens > 0 && !x))
    return KVA_ERR_ARG;
  sample.n_rows = (size_t)n_tokens, sample.row_len = (size_t)head_dim;
  sample.stride = (size_t)n_heads * (size_t)head_dim;
  for (h = 0; h < n_heads; h++) {
    sample.x = x ? x + (size_t)h * (size_t)head_dim : NULL;
    scales[h] = kva__fp8_choose_scale(t, &sample, rule);
  }
  return KVA_OK;
}

/* INT8 row: symmetric, scale = amax / 127 stored before the n codes; an
   all-zero row gives scale 0 and codes 0. Non-finite inputs: NaN stores 0,
   +-Inf stores +-127 with the scale of the finite values. */
static inline void kva__quantize_i8(int8_t *dst, const float *src, int n) {
  float amax = 0.0f, scale;
  double inv; /* in double: 127 / amax overflows float for subnormal amax */
  int i;
  for (i = 0; i < n; i++) {
    float a = fabsf(src[i]);
    if (a > amax && a <= FLT_MAX) amax = a;
  }
  scale = (float)((double)amax / 127.0);
  inv = amax > 0.0f ? 127.0 / (double)amax : 0.0;
  for (i = 0; i < n; i++) {
    float v = (float)((double)src[i] * inv);
    if (!(v == v)) v = 0.0f;
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    dst[i] = (int8_t)(v >= 0.0f ? (int)(v + 0.5f) : -(int)(0.5f - v));
  }
  memcpy(dst - sizeof scale, &scale, sizeof scale);
}

/* x rounded to the F16 at or below it (at or above: kva__f16_ceil),
   infinities kept */
static inline uint16_t kva__f16_floor(double x) {
  uint16_t h = kva_f32_to_f16((float)x);
  if ((double)kva_f16_to_f32(h) > x) /* one step down: a smaller magnitude, or from +0 to below 0 */
    h = h == 0 ? (uint16_t)0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1u) : (uint16_t)(h - 1u);
  return h;
}
static inline uint16_t kva__f16_ceil(double x) { return (uint16_t)(kva__f16_floor(-x) ^ 0x8000u); }
/* the same, saturated to +-65504 (INT4's group parameters) */
static inline uint16_t kva__f16_down(double x) { return kva__f16_floor(x > 65504.0 ? 65504.0 : x < -65504.0 ? -65504.0 : x); }
static inline uint16_t kva__f16_up(double x) { return (uint16_t)(kva__f16_down(-x) ^ 0x8000u); }

/* INT4 row (layout at kva__row_bytes): per group, min and max of its finite
   values; the minimum stored as the F16 at or below it (min'), the scale as
   the F16 at or above (max - min') / 15 (scale'), both saturated to
   +-65504; code = round((x - min') / scale') in 0..15, so x comes back as
   code * scale' + min' within half a step (scale' / 2) unless the group's
   range leaves F16's (then values below -65504 read back as the smallest
   code and above min' + 15 * 65504 as the largest). NaN stores code 0 (the
   minimum), +-Inf the largest / smallest code; a group without a finite
   value stores scale 0 and min 0. */
static inline void kva__quantize_i4(uint8_t *dst, const float *src, int n) {
  int g0, i;
  for (g0 = 0; g0 < n; g0 += KVA__I4_GROUP, dst += KVA__I4_GROUP_BYTES) {
    int m = n - g0 < KVA__I4_GROUP ? n - g0 : KVA__I4_GROUP;
    float mn = FLT_MAX, mx = -FLT_MAX, scale;
    uint16_t h[2];
    uint8_t *codes = dst + KVA__I4_PARAM_BYTES;
    for (i = 0; i < m; i++) {
      float x = src[g0 + i];
      if (!(x >= -FLT_MAX && x <= FLT_MAX)) continue;
      if (x < mn) mn = x;
      if (x > mx) mx = x;
    }
    if (mn > mx) mn = mx = 0.0f;
    h[1] = kva__f16_down((double)mn);
    mn = kva_f16_to_f32(h[1]);
    h[0] = kva__f16_up(((double)mx - (double)mn) / 15.0); /* in double: the range may overflow float */
    scale = kva_f16_to_f32(h[0]);
    memset(codes, 0, (size_t)(m + 1) / 2);
    kva__i4_encode(codes, src + g0, m, mn, scale);
    memcpy(dst, h, sizeof h);
  }
}

/* Stored rows start with INT8's scale; row pointers handed to kernels point at the codes. */
static inline size_t kva__code_offset(kva_dtype t) { return t == KVA_INT8 ? sizeof(float) : 0; }

/* Write one stored row (dst: its start) of n floats in type t; FP8 stores
   fp8(x / fp8_scale). */
static inline void kva__store_row(kva_dtype t, void *dst, const float *src, int n, float fp8_scale) {
  float inv = fp8_scale > 0.0f ? 1.0f / fp8_scale : 1.0f;
  uint8_t *b = (uint8_t *)dst;
  int i;
  switch (t) {
    case KVA_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVA_F16: kva__f32_to_f16_row((uint16_t *)dst, src, n); break;
    case KVA_BF16: for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = kva_f32_to_bf16(src[i]); break;
    case KVA_INT8: kva__quantize_i8((int8_t *)dst + sizeof(float), src, n); break;
    case KVA_FP8_E4M3: kva__fp8_encode(b, src, (size_t)n, inv, &kva__e4m3_format); break;
    case KVA_FP8_E5M2: kva__fp8_encode(b, src, (size_t)n, inv, &kva__e5m2_format); break;
    case KVA_INT4: kva__quantize_i4(b, src, n); break;
    default: KVATTN_ASSERT(0); break;
  }
}

/* Elements i0 .. i0+n-1 of a stored row, dequantized: exactly what the
   attention kernels see (the type's loop chosen once, INT8's scale read once) */
static inline void kva__load_elems(kva_dtype t, float *dst, const void *row, int i0, int n, float fp8_scale) {
  int i;
  switch (t) {
    case KVA_F32: memcpy(dst, (const float *)row + i0, (size_t)n * sizeof(float)); break;
    case KVA_INT8: {
      const int8_t *codes = (const int8_t *)row + sizeof(float);
      const float s = kva__row_scale(KVA_INT8, codes, fp8_scale);
      for (i = 0; i < n; i++) dst[i] = kva__load1(KVA_INT8, codes, i0 + i) * s;
      break;
    }
    case KVA_FP8_E4M3: for (i = 0; i < n; i++) dst[i] = kva_e4m3_to_f32(((const uint8_t *)row)[i0 + i]) * fp8_scale; break;
    case KVA_FP8_E5M2: for (i = 0; i < n; i++) dst[i] = kva_e5m2_to_f32(((const uint8_t *)row)[i0 + i]) * fp8_scale; break;
    case KVA_F16: for (i = 0; i < n; i++) dst[i] = kva__load1(KVA_F16, row, i0 + i); break;
    case KVA_BF16: for (i = 0; i < n; i++) dst[i] = kva__load1(KVA_BF16, row, i0 + i); break;
    case KVA_INT4: for (i = 0; i < n; i++) dst[i] = kva__load1_i4(row, i0 + i); break;
    default: KVATTN_ASSERT(0); break;
  }
}
/* Dequantize one stored row */
static inline void kva__load_row(kva_dtype t, float *dst, const void *src, int n, float fp8_scale) {
  kva__load_elems(t, dst, src, 0, n, fp8_scale);
}

/* ======================================================================
   [6] attention core
   One pass over a KV head's keys serves every query row of its group
   (row = query token x query head), in tiles of KVA__TILE keys with an
   online softmax. Accumulators live in the caller's output rows, so a
   decode call needs no heap memory.
   ====================================================================== */

/* Where the keys and values of one KV head come from. */
typedef struct {
  int paged;                          /* 0: plain arrays, 1: block table */
  kva_dtype kt, vt;
  const float *k_fp8_scale, *v_fp8_scale; /* [n_kv_heads] FP8 scales, or NULL (no FP8) */
  /* plain arrays: token j of head g at base + (j*n_kv_heads + g) * row bytes */
  const unsigned char *k, *v;
  size_t k_tok_stride, v_tok_stride;  /* bytes from token j to j+1 */
  size_t k_head_stride, v_head_stride;
  const int32_t *pos;                 /* NULL => position j */
  int32_t pos_max;                    /* no key's position exceeds this */
  float *key_scores;                  /* paged, H2O: [block][G][bs] accumulated probabilities, or NULL */
  /* paged: block b of a layer at pool + b * block_bytes */
  const unsigned char *pool;
  size_t block_bytes, v_off;          /* V region offset inside a block (== 0 offset for latent K) */
  size_t k_row, v_row;                /* bytes of one token of one head */
  size_t k_code_off, v_code_off;      /* from a stored row's start to its first value */
  const int32_t *table, *block_pos;   /* block_pos: [block][G][bs] */
  int block_size, n_kv_heads;
  /* tree attention: the keys at positions tree_base .. tree_base + tree_n - 1
     are the query tokens themselves, a tree by tree_parent (NULL: linear) */
  const int32_t *tree_parent;
  int32_t tree_base;
  int tree_n;
  int slots_are_positions;            /* key j sits at position j (before tree_base): nothing evicted */
  int has_empty;                      /* some slots hold no token in some head: positions KVA_POS_EMPTY */
  const int32_t *sel_first;           /* block selection, no block_pos: table[i]'s first token's position */
  const uint16_t *bounds;             /* paged, block bounds: [block][G][2][head dim] F16, or NULL */
} kva__kv_view;

/* Tree attention (speculative decoding): node i's parent is parent[i] < i,
   -1 for the cached prefix. A node sits at base + its depth, so that the
   accepted path's tokens keep their positions once kva_seq_accept packs them. */
static inline kva_status kva__tree_check(const int32_t *parent, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (parent[i] < -1 || parent[i] >= i) return KVA_ERR_ARG;
  return KVA_OK;
}
static inline int32_t kva__tree_depth(const int32_t *parent, int node) {
  int32_t d = 0;
  while (parent[node] >= 0) node = parent[node], d++;
  return d;
}
static inline int kva__tree_sees(const int32_t *parent, int node, int key) { /* key is node or its ancestor */
  while (node > key) node = parent[node];
  return node == key;
}

static inline float kva__view_scale(const float *per_head, int g) { return per_head ? per_head[g] : 1.0f; }

/* Fill a tile: rows j0 .. j0+n-1 of KV head g, their positions in kpos and
   the smallest and largest in *kmin, *kmax.
   With kpos NULL the positions are not read (the caller knows every key is
   visible) and the bounds are the view's: a paged tile's positions sit on
   their own line per block, and reading them cost a long decode a tenth. */
static inline void kva__view_fill(const kva__kv_view *w, int g, int j0, int n, const void **krows,
                                  const void **vrows, int32_t *kpos, int32_t *kmin, int32_t *kmax) {
  int j;
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  if (!w->paged) {
    for (j = 0; j < n; j++) {
      int t = j0 + j;
      krows[j] = w->k + (size_t)t * w->k_tok_stride + (size_t)g * w->k_head_stride;
      vrows[j] = w->v + (size_t)t * w->v_tok_stride + (size_t)g * w->v_head_stride;
      if (kpos) kpos[j] = w->pos ? w->pos[t] : (int32_t)t;
    }
  } else { /* walk the block table: slots of one head are contiguous inside a block */
    int bs = w->block_size, ti = j0 / bs, slot = j0 % bs;
    for (j = 0; j < n; ti++, slot = 0) {
      int32_t blk = w->table[ti];
      const unsigned char *b = w->pool + (size_t)blk * w->block_bytes;
      size_t hs = (size_t)g * (size_t)bs;
      const unsigned char *kr = b + (hs + (size_t)slot) * w->k_row + w->k_code_off;
      const unsigned char *vr = b + w->v_off + (hs + (size_t)slot) * w->v_row + w->v_code_off;
      const int32_t *pp = w->block_pos ? w->block_pos + ((size_t)blk * (size_t)w->n_kv_heads + (size_t)g) * (size_t)bs
                                       : NULL; /* NULL: nothing is evicted, a token's position is its slot */
      for (; slot < bs && j < n; slot++, j++, kr += w->k_row, vr += w->v_row) {
        krows[j] = kr;
        vrows[j] = vr;
        if (kpos) kpos[j] = pp ? pp[slot] : w->sel_first ? w->sel_first[ti] + (int32_t)slot : (int32_t)(j0 + j);
      }
    }
  }
  if (!kpos) {
    *kmin = INT32_MIN;
    *kmax = w->pos_max;
    return;
  }
  for (j = 0; j < n; j++) {
    if (kpos[j] < lo) lo = kpos[j];
    if (kpos[j] > hi) hi = kpos[j];
  }
  /* a tree node's key sits at base + its depth, which may be any of base ..
     its index: the tile's tests must not take its stored position as a bound */
  if (w->tree_parent && hi >= w->tree_base && lo > w->tree_base) lo = w->tree_base;
  *kmin = lo;
  *kmax = hi;
}

/* Every line of n rows at once: the first tile's V rows (they load while
   its scores are computed) and the tile after a skipped one. Later tiles
   arrive through kva__next_tile. */
static inline void kva__prefetch_rows(const void *const *rows, int n, size_t row_bytes) {
  int j;
  for (j = 0; j < n; j++) kva__prefetch_span(rows[j], row_bytes);
}

/* Resolved attention parameters. */
typedef struct {
  int H, G, D, DV, R; /* R = H / G query heads per KV head */
  float scale, softcap;
  int window, n_sink;
  size_t q_stride, o_stride; /* floats from one query token's row (out row) to the next */
  int non_causal;
  float alibi_max_bias;
  int chunk;              /* chunk_size, 0: none */
  const float *sinks;     /* sink_logits [H], or NULL */
  int int_scores;         /* quantized queries over INT8 / INT4 keys */
  int int_values;         /* quantized probabilities over INT8 / INT4 values */
  int select_budget, select_sink, select_recent; /* block selection (cache calls) */
} kva__attn_params;

/* The chunk of position p (floor division: positions may be negative in kva_attend). */
static inline int64_t kva__chunk_of(const kva__attn_params *P, int32_t p) {
  return p >= 0 ? (int64_t)p / P->chunk : -((-(int64_t)p - 1) / P->chunk) - 1;
}

static inline int kva__visible(const kva__attn_params *P, int32_t qp, int32_t kp) {
  int64_t dist = (int64_t)qp - (int64_t)kp;
  if (dist < 0 && !P->non_causal) return 0;
  if (P->chunk > 0 && kva__chunk_of(P, qp) != kva__chunk_of(P, kp)) return 0;
  if (P->window <= 0 || kp < P->n_sink) return 1;
  return (dist < 0 ? -dist : dist) < (int64_t)P->window;
}

/* ALiBi's slope of query head h (Press et al. 2022, as BLOOM and llama.cpp
   compute it for any head count): with n the largest power of two <= H,
   heads below n take 2^(-b/n)^(h+1), the rest 2^(-b/2n)^(2(h-n)+1). */
static inline float kva__alibi_slope(const kva__attn_params *P, int h) {
  int n = 1;
  if (P->alibi_max_bias == 0.0f) return 0.0f;
  while (n * 2 <= P->H) n *= 2;
  if (h < n) return (float)pow(2.0, -(double)P->alibi_max_bias / n * (h + 1));
  return (float)pow(2.0, -(double)P->alibi_max_bias / (2.0 * n) * (2 * (h - n) + 1));
}

/* Whether every key of a tile (positions kmin..kmax) is visible to every
   row (positions qmin..qmax): then the per-key mask can be skipped. */
static inline int kva__tile_all_visible(const kva__attn_params *P, int32_t qmin, int32_t qmax, int32_t kmin,
                                        int32_t kmax) {
  int64_t reach = (int64_t)qmax - (int64_t)kmin; /* the farthest distance in the tile */
  if (P->non_causal && (int64_t)kmax - (int64_t)qmin > reach) reach = (int64_t)kmax - (int64_t)qmin;
  if (P->chunk > 0 && kva__chunk_of(P, kmin < qmin ? kmin : qmin) != kva__chunk_of(P, kmax > qmax ? kmax : qmax))
    return 0; /* not all in one chunk */
  return (P->non_causal || kmax <= qmin) && (P->window <= 0 || reach < (int64_t)P->window);
}

/* Whether no key of a tile is visible to any row: every key in every row's
   future (causal), or out of every row's window. */
static inline int kva__tile_none_visible(const kva__attn_params *P, int32_t qmin, int32_t qmax, int32_t kmin,
                                         int32_t kmax) {
  if (kmin > qmax && !P->non_causal) return 1;
  if (P->chunk > 0 &&
      (kva__chunk_of(P, kmax) < kva__chunk_of(P, qmin) || kva__chunk_of(P, kmin) > kva__chunk_of(P, qmax)))
    return 1; /* every key in another chunk than every row */
  if (P->window <= 0 || kmin < P->n_sink) return 0;
  return (int64_t)qmin - (int64_t)kmax >= (int64_t)P->window ||
         (P->non_causal && (int64_t)kmin - (int64_t)qmax >= (int64_t)P->window);
}

/* One row's raw scores s[0..nk) become logits (scaled, soft-capped, ALiBi's
   -slope * distance added, -inf where masked) in place; returns their maximum. */
static inline float kva__logits(const kva__attn_params *P, float *s, int nk, int all_visible, int32_t qp,
                                const int32_t *kpos, float slope, const kva__kv_view *w, int qnode) {
  float mt = -INFINITY;
  int j;
  if (all_visible && P->softcap <= 0.0f && slope == 0.0f) return kva__scale_max(s, nk, P->scale);
  for (j = 0; j < nk; j++) {
    float x = s[j] * P->scale;
    int32_t kp = kpos ? kpos[j] : 0;
    int in_tree = 1; /* a tree node's key: visible to its descendants only, at base + its depth */
    if (w->tree_parent && kp >= w->tree_base && kp != KVA_POS_EMPTY) {
      in_tree = kva__tree_sees(w->tree_parent, qnode, kp - w->tree_base);
      kp = w->tree_base + kva__tree_depth(w->tree_parent, kp - w->tree_base);
    }
    if (P->softcap > 0.0f) x = P->softcap * tanhf(x / P->softcap);
    if (slope != 0.0f) {
      int64_t dist = (int64_t)qp - (int64_t)kp;
      x -= slope * (float)(dist < 0 ? -dist : dist);
    }
    if (!all_visible && !(in_tree && kva__visible(P, qp, kp) && !(w->has_empty && kp == KVA_POS_EMPTY))) x = -INFINITY;
    s[j] = x;
    if (x > mt) mt = x;
  }
  return mt;
}

/* The rows' smallest and largest positions, for the tile tests; under a
   tree, the largest also covers every node's index (a node's key sits at
   base + its index in the cache, and must not look like the future). */
static inline void kva__rows_range(const kva__kv_view *w, const int32_t *qp, int nrows, int32_t *qmin, int32_t *qmax) {
  int t;
  *qmin = INT32_MAX, *qmax = INT32_MIN;
  for (t = 0; t < nrows; t++) {
    if (qp[t] < *qmin) *qmin = qp[t];
    if (qp[t] > *qmax) *qmax = qp[t];
  }
  if (w->tree_parent && *qmax < w->tree_base + w->tree_n - 1) *qmax = w->tree_base + w->tree_n - 1;
}

/* Keys [*lo, *hi) that no row (positions qmin and up) can see by the window
   or the chunk rule, when a key's index is its position: the walk jumps
   over them without filling their tiles (a long sequence under a short
   window, or a group that released them). Empty otherwise. */
static inline void kva__unseen_keys(const kva__attn_params *P, const kva__kv_view *w, int32_t qmin, int *lo, int *hi) {
  /* a tree node at index j >= tree_base sits at tree_base + depth <= j: past the window if j is,
     unless that is below the sinks (then the walk stops at the first query; linear calls alike) */
  int64_t chunk_hi = 0, win_lo = P->n_sink, win_hi = 0, cap = w->tree_base < P->n_sink ? w->tree_base : INT32_MAX;
  *lo = *hi = 0;
  if (!w->slots_are_positions) return;
  if (P->chunk > 0) chunk_hi = (int64_t)kva__chunk_of(P, qmin) * P->chunk; /* earlier chunks */
  if (P->window > 0) win_hi = (int64_t)qmin - P->window + 1;               /* past the window, sinks aside */
  if (chunk_hi > cap) chunk_hi = cap;
  if (win_hi > cap) win_hi = cap;
  if (chunk_hi > 0 && chunk_hi >= win_lo) { /* the two ranges join */
    *hi = (int)(chunk_hi > win_hi ? chunk_hi : win_hi);
  } else if (win_hi - win_lo > chunk_hi) {
    *lo = (int)win_lo;
    *hi = (int)win_hi;
  } else if (chunk_hi > 0) {
    *hi = (int)chunk_hi;
  }
}

/* The first key of a tile that starts at j or later, past the unseen keys. */
static inline int kva__tile_start(int j, int skip_lo, int skip_hi) { return j >= skip_lo && j < skip_hi ? skip_hi : j; }
/* Keys in the tile starting at j: up to KVA__TILE, not into the unseen keys. */
static inline int kva__tile_keys(int j, int kv1, int skip_lo, int skip_hi) {
  int n = kv1 - j < KVA__TILE ? kv1 - j : KVA__TILE;
  if (j < skip_lo && skip_lo < skip_hi && j + n > skip_lo) n = skip_lo - j;
  return n;
}

/* Raw scores of query rows 0 .. nrows - 1 against a tile of keys, into
   their rows of the tile buffer: float queries (many rows: keys along the
   lanes; else four rows at a time), or their int8 codes (iq non-NULL:
   integer scores). The first row block's kernel prefetches `next`. */
static inline void kva__scores_tile(const kva__attn_params *P, const kva__kv_view *w, int g, const float *const *qr,
                                    const kva__qrow *iq, int nrows, const void *const *krows, int nk, float *scores,
                                    const kva__next_tile *next) {
  float fp8_scale = kva__view_scale(w->k_fp8_scale, g);
  int rb;
  if (!iq && nrows >= KVA__WIDE_ROWS) {
    kva__dot_tile(w->kt, qr, nrows, krows, nk, P->D, scores, KVA__TILE, fp8_scale, next);
    return;
  }
  for (rb = 0; rb < nrows; rb += KVA__NR) {
    int nr = nrows - rb < KVA__NR ? nrows - rb : KVA__NR;
    if (iq) kva__idot_tile(w->kt, iq + rb, nr, krows, nk, P->D, scores + rb * KVA__TILE, KVA__TILE, rb ? NULL : next);
    else
      kva__dot_tile(w->kt, qr + rb, nr, krows, nk, P->D, scores + rb * KVA__TILE, KVA__TILE, fp8_scale,
                    rb ? NULL : next);
  }
}

/* H2O's bookkeeping after a pass over keys kv0..kv1 of KV head g: each
   key's final probability (the pass's m and l), summed over the rows in row
   order, is added to its slot's score. The scores are recomputed tile by
   tile (the pass kept no probabilities); `scores` is the pass's tile buffer. */
static inline void kva__h2o_add_probs(const kva__attn_params *P, const kva__kv_view *w, int kv0, int kv1, int g,
                                      const float *const *qr, const kva__qrow *iq, const int32_t *qp, const int *qnode,
                                      const float *slope, int nrows, const float *m, const float *l, int read_pos,
                                      float *scores) {
  const void *krows[KVA__TILE], *vrows[KVA__TILE];
  int32_t kpos[KVA__TILE], kmin, kmax, qmin, qmax;
  int j0, j, t;
  kva__rows_range(w, qp, nrows, &qmin, &qmax);
  for (j0 = kv0; j0 < kv1; j0 += KVA__TILE) {
    int nk = kv1 - j0 < KVA__TILE ? kv1 - j0 : KVA__TILE, all_visible;
    float colsum[KVA__TILE];
    kva__view_fill(w, g, j0, nk, krows, vrows, read_pos ? kpos : NULL, &kmin, &kmax);
    if (kva__tile_none_visible(P, qmin, qmax, kmin, kmax)) continue; /* it adds 0 to every score */
    kva__scores_tile(P, w, g, qr, iq, nrows, krows, nk, scores, NULL);
    all_visible = kva__tile_all_visible(P, qmin, qmax, kmin, kmax) && !(w->tree_parent && kmax >= w->tree_base) &&
                  !(w->has_empty && kmax == KVA_POS_EMPTY);
    memset(colsum, 0, sizeof colsum);
    for (t = 0; t < nrows; t++) {
      float *s = scores + t * KVA__TILE, inv;
      if (l[t] <= 0.0f) continue;
      (void)kva__logits(P, s, nk, all_visible, qp[t], read_pos ? kpos : NULL, slope[t], w, qnode[t]);
      (void)kva__exp_sub_sum(s, nk, m[t]);
      inv = 1.0f / l[t];
      for (j = 0; j < nk; j++) colsum[j] += s[j] * inv;
    }
    for (j = 0; j < nk; j++) {
      int tk = j0 + j, bs = w->block_size;
      w->key_scores[((size_t)w->table[tk / bs] * (size_t)w->n_kv_heads + (size_t)g) * (size_t)bs + (size_t)(tk % bs)] +=
          colsum[j];
    }
  }
}

/* A learned sink logit: one more softmax term, with no value; the row's
   accumulator and sum are rescaled as for a new tile when it is the
   largest. A row that saw no key then has lse = sink and output 0. */
static inline void kva__add_sink(float *acc, int dv, float *m, float *l, float sink) {
  if (sink > *m) {
    if (*l > 0.0f) {
      float alpha = expf(*m - sink);
      (void)kva__scale_max(acc, dv, alpha);
      *l *= alpha;
    }
    *m = sink;
  }
  *l += expf(sink - *m);
}

/* Byte steps from one KV head's rows to the next head's (the same tokens):
   inside a block, or along a plain array. */
static inline void kva__view_head_step(const kva__kv_view *w, size_t *k_step, size_t *v_step) {
  *k_step = w->paged ? (size_t)w->block_size * w->k_row : w->k_head_stride;
  *v_step = w->paged ? (size_t)w->block_size * w->v_row : w->v_head_stride;
}
/* rows[j] + step for j < n */
static inline void kva__rows_shift(const void **dst, const void *const *rows, int n, size_t step) {
  int j;
  for (j = 0; j < n; j++) dst[j] = (const unsigned char *)rows[j] + step;
}

/* One pass of the attention core: query rows [row0, row0 + nrows) of each
   of the KV heads g .. g+ng-1 over keys [kv0, kv1) (row t: query t / R,
   head g*R + t % R). q [n_q][H][D], out [n_q][H][DV], lse NULL or [n_q][H];
   with `compact`, out is [nrows][DV] and lse [nrows] instead (a split's
   partial result). Query i sits at q_pos[i], or at q_base + i when q_pos
   is NULL. The functions below hand it on, changing the rows, the heads or
   where results go. */
typedef struct {
  const kva__attn_params *P;
  const kva__kv_view *w;
  const float *q;
  const int32_t *q_pos;
  int32_t q_base;
  int kv0, kv1, g, ng, row0, nrows;
  float *out, *lse;
  int compact;
} kva__pass;
/* What a call's passes share; each pass then sets its keys, heads, rows and outputs. */
static inline kva__pass kva__pass_base(const kva__attn_params *P, const kva__kv_view *w, const float *q,
                                       const int32_t *q_pos, int32_t q_base) {
  kva__pass ps;
  memset(&ps, 0, sizeof ps);
  ps.P = P, ps.w = w, ps.q = q, ps.q_pos = q_pos, ps.q_base = q_base;
  return ps;
}
/* The rows [row0, row0 + nrows) of KV heads g .. g+ng-1 of a pass over keys [kv0, kv1). */
static inline void kva__pass_rows(kva__pass *ps, int kv0, int kv1, int g, int ng, int row0, int nrows) {
  ps->kv0 = kv0, ps->kv1 = kv1, ps->g = g, ps->ng = ng, ps->row0 = row0, ps->nrows = nrows;
}

/* The pass's rows of each of its ng KV heads (ng > 1 only where every head's key j sits at the same
   position and no H2O scores are kept: see kva__attend_all). The walk is tile by tile, and each tile serves every
   head of the group before the next, so a paged walk reads each block's
   head slices one after another instead of leaving every 4 KiB slice for
   another block; each head's arithmetic is that of a pass of its own. */
static inline void kva__attend_rows_with(const kva__pass *ps, const kva__qrow *iq) {
  const kva__attn_params *P = ps->P;
  const kva__kv_view *w = ps->w;
  const float *q = ps->q;
  const int32_t *q_pos = ps->q_pos;
  const int32_t q_base = ps->q_base;
  const int kv0 = ps->kv0, kv1 = ps->kv1, g = ps->g, ng = ps->ng, row0 = ps->row0, nrows = ps->nrows;
  float *out = ps->out, *lse = ps->lse;
  const int compact = ps->compact;
  float scores[KVA__MAXROWS * KVA__TILE];
  float m[KVA__MAXROWS], l[KVA__MAXROWS], slope[KVA__MAXROWS];
  const float *qr[KVA__MAXROWS];
  float *acc[KVA__MAXROWS];
  /* tile b of the KV range lives in buffer b % 2: the next tile is filled
     (and prefetched) while this one computes, and filled once */
  int32_t qp[KVA__MAXROWS], kpos_buf[2][KVA__TILE], kmin_buf[2], kmax_buf[2], qmin, qmax;
  int qnode[KVA__MAXROWS], qhead[KVA__MAXROWS];
  const void *krows_buf[2][KVA__TILE], *vrows_buf[2][KVA__TILE];
  const void *head_k[2][KVA__TILE], *head_v[2][KVA__TILE]; /* heads after the first: their tile's rows */
  const void **krows, **vrows;
  int32_t *kpos, kmin, kmax;
  size_t kbytes = kva__row_bytes(w->kt, P->D), vbytes = kva__row_bytes(w->vt, P->DV), k_step, v_step;
  kva__next_tile next; /* what follows this head's tile, prefetched by its score kernel */
  int t, j0, jn, hh, prefetch_next, read_pos, skip_lo, skip_hi, cb, first_tile = 1, all = ng * nrows;
  KVATTN_ASSERT(all <= KVA__MAXROWS && (ng == 1 || (!compact && !w->key_scores && (!w->block_pos || w->slots_are_positions))));
  kva__view_head_step(w, &k_step, &v_step);
  for (t = 0; t < all; t++) {
    int row = row0 + t % nrows, i = row / P->R, h = (g + t / nrows) * P->R + row % P->R;
    qr[t] = q + (size_t)i * P->q_stride + (size_t)h * (size_t)P->D;
    acc[t] = out + (compact ? (size_t)t * (size_t)P->DV : (size_t)i * P->o_stride + (size_t)h * (size_t)P->DV);
    memset(acc[t], 0, (size_t)P->DV * sizeof(float));
    qp[t] = q_pos ? q_pos[i] : (int32_t)(q_base + i);
    qnode[t] = i;
    qhead[t] = h;
    if (w->tree_parent) qp[t] = w->tree_base + kva__tree_depth(w->tree_parent, i);
    slope[t] = kva__alibi_slope(P, h);
    m[t] = -INFINITY;
    l[t] = 0.0f;
  }
  kva__rows_range(w, qp, all, &qmin, &qmax);
  /* a decode step (no window, no key after any query) masks nothing */
  read_pos = P->window > 0 || P->alibi_max_bias != 0.0f || w->tree_parent || P->chunk > 0 || w->has_empty ||
             (!P->non_causal && w->pos_max > qmin);
  kva__unseen_keys(P, w, qmin, &skip_lo, &skip_hi);
  j0 = kva__tile_start(kv0, skip_lo, skip_hi);
  if (j0 < kv1)
    kva__view_fill(w, g, j0, kva__tile_keys(j0, kv1, skip_lo, skip_hi), krows_buf[0], vrows_buf[0],
                   read_pos ? kpos_buf[0] : NULL, &kmin_buf[0], &kmax_buf[0]);
  for (cb = 0; j0 < kv1; j0 = jn, cb = !cb, first_tile = 0) {
    int nk = kva__tile_keys(j0, kv1, skip_lo, skip_hi), nn, all_visible;
    jn = kva__tile_start(j0 + nk, skip_lo, skip_hi);
    nn = jn < kv1 ? kva__tile_keys(jn, kv1, skip_lo, skip_hi) : 0;
    kpos = kpos_buf[cb];
    kmin = kmin_buf[cb];
    kmax = kmax_buf[cb];
    if (first_tile && kmin <= qmax) kva__prefetch_rows(vrows_buf[cb], nk, vbytes); /* the first tile's V */
    prefetch_next = 0;
    if (nn > 0) {
      kva__view_fill(w, g, jn, nn, krows_buf[!cb], vrows_buf[!cb], read_pos ? kpos_buf[!cb] : NULL,
                     &kmin_buf[!cb], &kmax_buf[!cb]);
      prefetch_next = kmin_buf[!cb] <= qmax;
    }
    if (kva__tile_none_visible(P, qmin, qmax, kmin, kmax)) {
      if (prefetch_next) {
        kva__prefetch_rows(krows_buf[!cb], nn, kbytes);
        kva__prefetch_rows(vrows_buf[!cb], nn, vbytes);
      }
      continue;
    }
    all_visible = kva__tile_all_visible(P, qmin, qmax, kmin, kmax) && !(w->tree_parent && kmax >= w->tree_base) &&
                  !(w->has_empty && kmax == KVA_POS_EMPTY);
    krows = krows_buf[cb];
    vrows = vrows_buf[cb];
    for (hh = 0; hh < ng; hh++) {
      int t0 = hh * nrows;
      if (hh + 1 < ng) { /* next: the next head's rows of this tile */
        kva__rows_shift(head_k[hh % 2], krows_buf[cb], nk, (size_t)(hh + 1) * k_step);
        kva__rows_shift(head_v[hh % 2], vrows_buf[cb], nk, (size_t)(hh + 1) * v_step);
        next.k = head_k[hh % 2];
        next.v = head_v[hh % 2];
        next.n = nk;
      } else { /* the first head's rows of the next tile */
        next.k = krows_buf[!cb];
        next.v = vrows_buf[!cb];
        next.n = prefetch_next ? nn : 0;
      }
      next.k_bytes = kbytes;
      next.v_bytes = next.n > 0 && next.v[0] == next.k[0] ? 0 : vbytes;
      kva__scores_tile(P, w, g + hh, qr + t0, iq ? iq + t0 : NULL, nrows, krows, nk, scores + t0 * KVA__TILE, &next);
      for (t = t0; t < t0 + nrows; t++) {
        float *s = scores + t * KVA__TILE;
        float mt = kva__logits(P, s, nk, all_visible, qp[t], read_pos ? kpos : NULL, slope[t], w, qnode[t]);
        if (mt == -INFINITY) { /* nothing visible in this tile for this row */
          memset(s, 0, (size_t)nk * sizeof(float));
          continue;
        }
        if (mt > m[t]) {
          if (l[t] > 0.0f) {
            float alpha = expf(m[t] - mt);
            (void)kva__scale_max(acc[t], P->DV, alpha); /* the vector scale; its max goes unused */
            l[t] *= alpha;
          }
          m[t] = mt;
        }
        l[t] += kva__exp_sub_sum(s, nk, m[t]);
      }
      if (P->int_values && kva__int_valued(w->vt))
        kva__ivacc_tile(w->vt, acc + t0, nrows, scores + t0 * KVA__TILE, KVA__TILE, vrows, nk, P->DV);
      else
        for (t = t0; t < t0 + nrows; t += KVA__NR) {
          int nr = t0 + nrows - t < KVA__NR ? t0 + nrows - t : KVA__NR;
          kva__vacc_tile(w->vt, acc + t, nr, scores + t * KVA__TILE, KVA__TILE, vrows, nk, P->DV,
                         kva__view_scale(w->v_fp8_scale, g + hh));
        }
      if (hh + 1 < ng) { /* the next head reads the rows just prefetched */
        krows = head_k[hh % 2];
        vrows = head_v[hh % 2];
      }
    }
  }
  if (P->sinks && !compact) /* a split's part leaves the sink to the merge */
    for (t = 0; t < all; t++) kva__add_sink(acc[t], P->DV, &m[t], &l[t], P->sinks[qhead[t]]);
  if (w->key_scores) kva__h2o_add_probs(P, w, kv0, kv1, g, qr, iq, qp, qnode, slope, nrows, m, l, read_pos, scores);
  for (t = 0; t < all; t++) {
    int row = row0 + t % nrows, i = row / P->R;
    if (l[t] > 0.0f) (void)kva__scale_max(acc[t], P->DV, 1.0f / l[t]);
    if (lse) lse[compact ? (size_t)t : (size_t)i * (size_t)P->H + (size_t)qhead[t]] = l[t] > 0.0f ? m[t] + logf(l[t]) : -INFINITY;
  }
}

/* kva__attend_rows_with for integer scores: the rows' query codes live on
   the stack, so rows pass in groups that fit KVA__IQ_STACK_BYTES (a head
   group whose rows do not all fit passes head by head). */
static inline void kva__attend_rows_int(const kva__pass *ps) {
  const kva__attn_params *P = ps->P;
  int32_t mem[KVA__IQ_STACK_BYTES / sizeof(int32_t)];
  kva__qrow iq[KVA__MAXROWS];
  size_t row_bytes = kva__qrow_bytes(P->D);
  int per = (int)(sizeof mem / row_bytes), t0, t, hh;
  if (per > KVA__MAXROWS) per = KVA__MAXROWS;
  if (ps->ng > 1 && ps->ng * ps->nrows > per) { /* the group's codes do not fit: head by head */
    for (hh = 0; hh < ps->ng; hh++) {
      kva__pass one = *ps;
      one.g = ps->g + hh;
      one.ng = 1;
      kva__attend_rows_int(&one);
    }
    return;
  }
  for (t0 = 0; t0 < ps->ng * ps->nrows; t0 += per) { /* a group passes at once; one head, in parts that fit */
    int n = ps->ng * ps->nrows - t0 < per ? ps->ng * ps->nrows - t0 : per;
    kva__pass part = *ps;
    for (t = 0; t < n; t++) {
      int row = ps->row0 + (t0 + t) % ps->nrows, i = row / P->R, h = (ps->g + (t0 + t) / ps->nrows) * P->R + row % P->R;
      kva__quantize_query(ps->q + (size_t)i * P->q_stride + (size_t)h * (size_t)P->D, P->D, ps->w->kt,
                          (char *)mem + (size_t)t * row_bytes, &iq[t]);
    }
    part.row0 = ps->row0 + t0;
    part.nrows = ps->ng > 1 ? ps->nrows : n;
    if (ps->compact) {
      part.out = ps->out + (size_t)t0 * (size_t)P->DV;
      part.lse = ps->lse ? ps->lse + t0 : NULL;
    }
    kva__attend_rows_with(&part, iq);
  }
}

/* The pass, with float or integer scores. */
static inline void kva__attend_rows(const kva__pass *ps) {
  if (ps->P->int_scores && kva__int_scored(ps->w->kt) && ps->P->D <= KVA__IQ_MAX_D) kva__attend_rows_int(ps);
  else kva__attend_rows_with(ps, NULL);
}

/* Combine S normalised partial results of one row over disjoint key sets
   (part s: parts[s], log-sum-exp lses[s]) into out; returns the row's lse.
   out may be parts[0]. */
static inline float kva__merge_row(float *out, const float *const *parts, const float *lses, int S, int dv) {
  float mx = -INFINITY, wsum = 0.0f, wt[KVA__MAXSPLIT], inv;
  int s, i, live = 0, last = 0;
  KVATTN_ASSERT(S <= KVA__MAXSPLIT);
  for (s = 0; s < S; s++)
    if (lses[s] > mx) mx = lses[s];
  if (mx == -INFINITY) { /* no part saw a key */
    memset(out, 0, (size_t)dv * sizeof(float));
    return -INFINITY;
  }
  for (s = 0; s < S; s++) {
    wsum += wt[s] = lses[s] > -INFINITY ? expf(lses[s] - mx) : 0.0f;
    if (wt[s] != 0.0f) last = s, live++;
  }
  if (live == 1) { /* one part saw keys: it is the answer, bit for bit */
    if (out != parts[last]) memmove(out, parts[last], (size_t)dv * sizeof(float));
    return lses[last];
  }
  inv = 1.0f / wsum;
  for (s = 0; s < S; s++) wt[s] *= inv;
  for (i = 0; i < dv; i++) {
    float x = 0.0f;
    for (s = 0; s < S; s++)
      if (wt[s] != 0.0f) x += wt[s] * parts[s][i];
    out[i] = x;
  }
  return mx + logf(wsum);
}

static inline int kva__threads(int n_threads) {
#if KVA__OMP
  return n_threads > 0 ? n_threads : omp_get_max_threads();
#else
  (void)n_threads;
  return 1;
#endif
}

/* Merge the S split results of one item (KV head g, rows row0 ..
   row0 + nrows - 1): split s at parts + s * part_stride holds rows_cap
   partial rows of DV, then their rows_cap lse values. */
static inline void kva__merge_item(const kva__attn_params *P, int g, int row0, int nrows, const float *parts,
                                   size_t part_stride, int rows_cap, int S, float *out, float *lse) {
  int t, s;
  for (t = 0; t < nrows; t++) {
    int row = row0 + t, i = row / P->R, h = g * P->R + row % P->R;
    const float *part[KVA__MAXSPLIT];
    float lses[KVA__MAXSPLIT], l_;
    size_t o = (size_t)i * (size_t)P->H + (size_t)h;
    for (s = 0; s < S; s++) {
      const float *po = parts + (size_t)s * part_stride;
      part[s] = po + (size_t)t * (size_t)P->DV;
      lses[s] = po[(size_t)rows_cap * (size_t)P->DV + (size_t)t];
    }
    l_ = kva__merge_row(out + (size_t)i * P->o_stride + (size_t)h * (size_t)P->DV, part, lses, S, P->DV);
    if (P->sinks) { /* the sink joins once, after the parts: out = out * L / (L + e^sink) */
      float mx = l_ > P->sinks[h] ? l_ : P->sinks[h], wa = l_ > -INFINITY ? expf(l_ - mx) : 0.0f;
      float ws = expf(P->sinks[h] - mx);
      (void)kva__scale_max(out + (size_t)i * P->o_stride + (size_t)h * (size_t)P->DV, P->DV, wa / (wa + ws));
      l_ = mx + logf(wa + ws);
    }
    if (lse) lse[o] = l_;
  }
}

/* Split-K (flash-decoding): when a call has fewer (KV head, row chunk)
   items than KVA__SPLIT_TARGET, each item's key range is cut into splits of
   at least KVA__SPLIT_MIN keys that run as separate work units, and their
   partial results are merged by log-sum-exp. The split depends on the shape
   only, never on the thread count, so results stay identical for any number
   of threads. */
static inline int kva__kv_splits(int items, int n_kv, int has_scores) {
  int s;
  if (has_scores || items <= 0 || items >= KVA__SPLIT_TARGET) return 1; /* H2O needs each row's final softmax */
  s = (KVA__SPLIT_TARGET + items - 1) / items;
  if (s > n_kv / KVA__SPLIT_MIN) s = n_kv / KVA__SPLIT_MIN;
  return s < 1 ? 1 : s;
}

/* keys of split s of S over n_kv, cut on tile boundaries */
static inline void kva__split_range(int n_kv, int S, int s, int *kv0, int *kv1) {
  int64_t tiles = (n_kv + KVA__TILE - 1) / KVA__TILE;
  int64_t a = tiles * s / S * KVA__TILE, b = tiles * (s + 1) / S * KVA__TILE;
  *kv0 = (int)a;
  *kv1 = b < n_kv ? (int)b : n_kv;
}

/* Where a call's temporary memory comes from: a cache's alloc_fn / free_fn
   (so an engine's allocator sees it), or KVATTN_MALLOC when alloc_fn is NULL. */
typedef struct {
  void *(*alloc_fn)(size_t size, size_t align, void *user);
  void (*free_fn)(void *p, size_t size, void *user);
  void *user;
} kva__heap;

static inline void *kva__heap_take(const kva__heap *h, size_t bytes) {
  return h->alloc_fn ? h->alloc_fn(bytes, 64, h->user) : KVATTN_MALLOC(bytes);
}

static inline void kva__heap_give(const kva__heap *h, void *p, size_t bytes) {
  if (!p) return;
  if (h->free_fn) h->free_fn(p, bytes, h->user);
  else KVATTN_FREE(p);
}

/* All rows of all KV heads; work items (KV head, row chunk), or their
   splits, run in parallel. Split partial results go to `scratch` (room for
   scratch_floats) and, if they do not fit, to memory from `heap` (NULL: the
   call may not allocate); otherwise the split count shrinks to what fits
   (still a function of the shape alone). */
static inline void kva__attend_all(const kva__attn_params *P, const kva__kv_view *w, int n_kv, const float *q,
                                   int n_q, const int32_t *q_pos, int32_t q_base, float *out, float *lse,
                                   int n_threads, float *scratch, size_t scratch_floats, const kva__heap *heap) {
  int rows = n_q * P->R, chunks = (rows + KVA__MAXROWS - 1) / KVA__MAXROWS;
  /* with key scores, one item per KV head: its chunks add to the same keys */
  int per_item = w->key_scores ? chunks : 1;
  int items = P->G * (chunks / per_item), it, nt = kva__threads(n_threads), u;
  int S = kva__kv_splits(items, n_kv, w->key_scores != NULL);
  int item_rows = rows < KVA__MAXROWS ? rows : KVA__MAXROWS;
  size_t part = (size_t)item_rows * ((size_t)P->DV + 1); /* one unit's partial rows, then their lse */
  const kva__pass base = kva__pass_base(P, w, q, q_pos, q_base);
  float *taken = NULL;
  size_t taken_bytes = (size_t)items * (size_t)S * part * sizeof(float);
  if (S > 1 && (size_t)items * (size_t)S * part > scratch_floats) {
    if (heap) scratch = taken = (float *)kva__heap_take(heap, taken_bytes);
    if (!taken) S = (int)(scratch_floats / ((size_t)items * part)); /* no memory: fewer splits, same rule */
  }
  if (S > 1) {
    int units = items * S, ntu = nt < units ? nt : units;
    (void)ntu;
    KVA__OMP_FOR(ntu)
    for (u = 0; u < units; u++) {
      int c0 = (u / S % chunks) * KVA__MAXROWS, kv0, kv1;
      kva__pass ps = base;
      kva__split_range(n_kv, S, u % S, &kv0, &kv1);
      kva__pass_rows(&ps, kv0, kv1, u / S / chunks, 1, c0, rows - c0 < KVA__MAXROWS ? rows - c0 : KVA__MAXROWS);
      ps.out = scratch + (size_t)u * part;
      ps.lse = ps.out + (size_t)item_rows * (size_t)P->DV;
      ps.compact = 1;
      kva__attend_rows(&ps);
    }
    if (nt > items) nt = items;
    KVA__OMP_FOR(nt)
    for (it = 0; it < items; it++) {
      int c0 = it % chunks * KVA__MAXROWS;
      kva__merge_item(P, it / chunks, c0, rows - c0 < KVA__MAXROWS ? rows - c0 : KVA__MAXROWS,
                      scratch + (size_t)it * (size_t)S * part, part, item_rows, S, out, lse);
    }
    if (taken) kva__heap_give(heap, taken, taken_bytes);
    return;
  }
  /* unsplit (or no memory for the partial results: the same answer, one unit per item) */
  if (nt > items) nt = items; /* no idle team members */
  if (chunks == 1 && !w->key_scores && (!w->block_pos || w->slots_are_positions) && 2 * rows <= KVA__MAXROWS) {
    /* few rows per KV head (decode): a unit walks the keys once for a group of
       heads, tile by tile (kva__attend_rows_with); the heads' results do not
       depend on the grouping, so it may follow the thread count */
    int ng = KVA__MAXROWS / rows, groups;
    if (ng > (P->G + nt - 1) / nt) ng = (P->G + nt - 1) / nt;
    groups = (P->G + ng - 1) / ng;
    KVA__OMP_FOR(nt)
    for (it = 0; it < groups; it++) {
      int g0 = it * ng;
      kva__pass ps = base;
      kva__pass_rows(&ps, 0, n_kv, g0, P->G - g0 < ng ? P->G - g0 : ng, 0, rows);
      ps.out = out, ps.lse = lse;
      kva__attend_rows(&ps);
    }
    return;
  }
  KVA__OMP_FOR(nt)
  for (it = 0; it < items; it++) {
    int g = it / (chunks / per_item), k;
    for (k = 0; k < per_item; k++) {
      int c0 = ((it % (chunks / per_item)) * per_item + k) * KVA__MAXROWS;
      kva__pass ps = base;
      kva__pass_rows(&ps, 0, n_kv, g, 1, c0, rows - c0 < KVA__MAXROWS ? rows - c0 : KVA__MAXROWS);
      ps.out = out, ps.lse = lse;
      kva__attend_rows(&ps);
    }
  }
}

/* Validates a kva_attn; on a broken rule, *why names it (the condition, as written here). */
#define KVA__ATTN_RULE(broken)  \
  do {                          \
    if (broken) {               \
      *why = #broken;           \
      return KVA_ERR_ARG;       \
    }                           \
  } while (0)
static inline kva_status kva__attn_resolve(const kva_attn *a, kva__attn_params *P, const char **why) {
  KVA__ATTN_RULE(!a);
  KVA__ATTN_RULE(a->n_heads <= 0 || a->n_kv_heads <= 0 || a->head_dim <= 0 || a->v_dim < 0);
  KVA__ATTN_RULE(a->n_heads > (1 << 16) || a->head_dim > (1 << 16) || a->v_dim > (1 << 16));
  KVA__ATTN_RULE(a->n_heads % a->n_kv_heads != 0);
  KVA__ATTN_RULE(a->window < 0);
  KVA__ATTN_RULE(a->n_sink < 0);
  KVA__ATTN_RULE(a->n_threads < 0);
  KVA__ATTN_RULE(!(a->softcap >= 0.0f) || a->softcap > FLT_MAX); /* rejects NaN, Inf */
  KVA__ATTN_RULE(!(a->scale >= -FLT_MAX && a->scale <= FLT_MAX));
  KVA__ATTN_RULE(a->q_stride < 0 || a->out_stride < 0 || a->k_stride < 0 || a->v_stride < 0);
  /* rows may not overlap */
  KVA__ATTN_RULE(a->q_stride && a->q_stride < a->n_heads * a->head_dim);
  KVA__ATTN_RULE(a->out_stride && a->out_stride < a->n_heads * (a->v_dim ? a->v_dim : a->head_dim));
  KVA__ATTN_RULE(a->k_stride && a->k_stride < a->n_kv_heads * a->head_dim);
  KVA__ATTN_RULE(a->v_stride && a->v_stride < a->n_kv_heads * (a->v_dim ? a->v_dim : a->head_dim));
  P->H = a->n_heads;
  P->G = a->n_kv_heads;
  P->D = a->head_dim;
  P->DV = a->v_dim ? a->v_dim : a->head_dim;
  P->R = a->n_heads / a->n_kv_heads;
  P->scale = a->scale != 0.0f ? a->scale : (float)(1.0 / sqrt((double)a->head_dim));
  P->softcap = a->softcap;
  P->window = a->window;
  P->n_sink = a->n_sink;
  KVA__ATTN_RULE(a->non_causal < 0 || a->non_causal > 1 || (a->non_causal && a->tree_parent));
  KVA__ATTN_RULE(!(a->alibi_max_bias >= 0.0f) || a->alibi_max_bias > 64.0f);
  P->non_causal = a->non_causal;
  P->alibi_max_bias = a->alibi_max_bias;
  KVA__ATTN_RULE(a->chunk_size < 0);
  P->chunk = a->chunk_size;
  P->sinks = a->sink_logits;
  KVA__ATTN_RULE(a->int_scores < 0 || a->int_scores > 1);
  P->int_scores = a->int_scores;
  KVA__ATTN_RULE(a->int_values < 0 || a->int_values > 1);
  P->int_values = a->int_values;
  KVA__ATTN_RULE(a->select_budget < 0 || a->select_sink < 0 || a->select_recent < 0);
  P->select_budget = a->select_budget;
  P->select_sink = a->select_sink;
  P->select_recent = a->select_recent;
  if (a->sink_logits) {
    int h;
    for (h = 0; h < a->n_heads; h++)
      KVA__ATTN_RULE(!(a->sink_logits[h] >= -FLT_MAX && a->sink_logits[h] <= FLT_MAX));
  }
  P->q_stride = a->q_stride ? (size_t)a->q_stride : (size_t)P->H * (size_t)P->D;
  P->o_stride = a->out_stride ? (size_t)a->out_stride : (size_t)P->H * (size_t)P->DV;
  return KVA_OK;
}

/* NULL when a is a valid description; else the rule it breaks (the
   condition, as written in kva__attn_resolve). */
KVA_API const char *kva_attn_check(const kva_attn *a) {
  kva__attn_params P;
  const char *why = NULL;
  return kva__attn_resolve(a, &P, &why) == KVA_OK ? NULL : why;
}

/* Scaled dot-product attention on plain float arrays (docs/API.md).
   out must not overlap q, k or v. */
KVA_API kva_status kva_attend(const kva_attn *a, const float *q, int n_q, const int32_t *q_pos, const float *k,
                              const float *v, int n_kv, const int32_t *kv_pos, float *out, float *lse) {
  kva__attn_params P;
  kva__kv_view w;
  const char *why;
  if (kva__attn_resolve(a, &P, &why) != KVA_OK) return KVA_ERR_ARG;
  if (P.select_budget > 0) return KVA_ERR_UNSUPPORTED; /* plain arrays keep no block bounds */
  if (n_q < 0 || n_kv < 0) return KVA_ERR_ARG;
  if (n_q == 0) return KVA_OK;
  if (!q || !out || (n_kv > 0 && (!k || !v))) return KVA_ERR_ARG;
  if (!q_pos && n_q > n_kv) return KVA_ERR_ARG;
  if ((size_t)n_q * (size_t)P.H > (size_t)INT_MAX / 2) return KVA_ERR_ARG;
  if (a->tree_parent && (q_pos || kv_pos || kva__tree_check(a->tree_parent, n_q) != KVA_OK)) return KVA_ERR_ARG;
  memset(&w, 0, sizeof w);
  w.kt = w.vt = KVA_F32;
  w.k = (const unsigned char *)k;
  w.v = (const unsigned char *)v;
  w.k_head_stride = (size_t)P.D * sizeof(float);
  w.v_head_stride = (size_t)P.DV * sizeof(float);
  w.k_tok_stride = a->k_stride ? (size_t)a->k_stride * sizeof(float) : w.k_head_stride * (size_t)P.G;
  w.v_tok_stride = a->v_stride ? (size_t)a->v_stride * sizeof(float) : w.v_head_stride * (size_t)P.G;
  w.pos = kv_pos;
  w.pos_max = kv_pos ? INT32_MAX : n_kv - 1;
  w.slots_are_positions = kv_pos == NULL;
  w.tree_parent = a->tree_parent; /* the queries are the last n_q keys */
  w.tree_base = n_kv - n_q;
  w.tree_n = n_q;
  if (!q_pos && kv_pos) q_pos = kv_pos + (n_kv - n_q); /* the queries are the last n_q keys */
  {
    float scratch[KVA__STACK_SCRATCH]; /* split-K partials of a decode step, which never allocates */
    kva__heap plain = {NULL, NULL, NULL}; /* KVATTN_MALLOC */
    kva__attend_all(&P, &w, n_kv, q, n_q, q_pos, (int32_t)(n_kv - n_q), out, lse, a->n_threads, scratch,
                    KVA__STACK_SCRATCH, n_q > 1 ? &plain : NULL);
  }
  return KVA_OK;
}

/* Merge attention over two disjoint key sets of the same query rows, as
   kva_attend returns them (out [n_rows][dv] normalised, lse [n_rows]):
   afterwards (out, lse) is the attention over both sets. Cascade attention
   (a shared prefix attended once, each request's own suffix) and split-K
   parts combine this way; a part with lse -INFINITY saw no key. */
KVA_API kva_status kva_merge_lse(float *out, float *lse, const float *out_b, const float *lse_b, int n_rows, int dv) {
  int r;
  if (n_rows < 0 || dv <= 0) return KVA_ERR_ARG;
  if (n_rows > 0 && (!out || !lse || !out_b || !lse_b)) return KVA_ERR_ARG;
  for (r = 0; r < n_rows; r++) {
    const float *parts[2];
    float lses[2];
    parts[0] = out + (size_t)r * (size_t)dv;
    parts[1] = out_b + (size_t)r * (size_t)dv;
    lses[0] = lse[r];
    lses[1] = lse_b[r];
    lse[r] = kva__merge_row(out + (size_t)r * (size_t)dv, parts, lses, 2, dv);
  }
  return KVA_OK;
}

/* ======================================================================
   [7] RoPE
   ====================================================================== */

static inline kva_status kva__rope_check(const kva_rope *r, int head_dim, int *dim) {
  int d;
  if (!r || head_dim <= 0) return KVA_ERR_ARG;
  d = r->dim ? r->dim : head_dim;
  if (d < 0 || d > head_dim || (d & 1)) return KVA_ERR_ARG;
  if (!r->inv_freq && !(r->theta >= 0.0f && r->theta <= FLT_MAX)) return KVA_ERR_ARG;
  if (r->table_len < 0 || (r->table_len > 0 && !r->table)) return KVA_ERR_ARG;
  *dim = d;
  return KVA_OK;
}

static inline int kva__rope_active(const kva_rope *r) { return r && (r->theta != 0.0f || r->inv_freq); }

/* cos and sin of pair i of position pos, rounded to float: the table holds
   exactly these, so rotating with or without a table gives the same bits. */
static inline void kva__rope_angle(const kva_rope *r, int dim, int i, int32_t pos, float *c, float *s) {
  double f = r->inv_freq ? (double)r->inv_freq[i] : pow((double)r->theta, -2.0 * i / (double)dim);
  double ang = (double)pos * f;
  *c = (float)cos(ang);
  *s = (float)sin(ang);
}

/* Rotate one token's heads: x [n_heads][head_dim] at position pos. */
static inline void kva__rope_token(const kva_rope *r, int dim, float *x, int n_heads, int head_dim, int32_t pos) {
  int half = dim / 2, i, h;
  const float *row = r->table && pos >= 0 && pos < r->table_len ? r->table + (size_t)pos * (size_t)dim : NULL;
  for (i = 0; i < half; i++) {
    float cf, sf;
    double c, s;
    if (row) cf = row[2 * i], sf = row[2 * i + 1];
    else kva__rope_angle(r, dim, i, pos, &cf, &sf);
    c = (double)cf, s = (double)sf;
    for (h = 0; h < n_heads; h++) {
      float *xh = x + (size_t)h * (size_t)head_dim;
      int i0 = r->interleaved ? 2 * i : i, i1 = r->interleaved ? 2 * i + 1 : i + half;
      double a = (double)xh[i0], b = (double)xh[i1];
      xh[i0] = (float)(a * c - b * s);
      xh[i1] = (float)(a * s + b * c);
    }
  }
}

/* Floats of a table of n_pos positions: [n_pos][dim/2][cos, sin]; 0 on bad arguments. */
KVA_API size_t kva_rope_table_floats(const kva_rope *r, int head_dim, int n_pos) {
  int dim = 0;
  if (kva__rope_check(r, head_dim, &dim) != KVA_OK || n_pos < 0) return 0;
  return (size_t)n_pos * (size_t)dim;
}

/* cos/sin of positions 0 .. n_pos-1 for r, once, for kva_rope.table */
KVA_API kva_status kva_rope_table_init(const kva_rope *r, int head_dim, int n_pos, float *table) {
  int dim = 0, i;
  int32_t p;
  if (kva__rope_check(r, head_dim, &dim) != KVA_OK || n_pos < 0 || (n_pos > 0 && !table)) return KVA_ERR_ARG;
  for (p = 0; p < n_pos; p++)
    for (i = 0; i < dim / 2; i++) {
      float *e = table + (size_t)p * (size_t)dim + 2 * (size_t)i;
      kva__rope_angle(r, dim, i, p, &e[0], &e[1]);
    }
  return KVA_OK;
}

/* In place over n_tokens rows of x, token t's heads [n_heads][head_dim] at
   x + t * stride (0: packed); pos NULL => 0..n_tokens-1. */
KVA_API kva_status kva_rope_apply_strided(const kva_rope *r, float *x, int stride, int n_tokens, int n_heads,
                                          int head_dim, const int32_t *pos) {
  int dim = 0, t;
  if (kva__rope_check(r, head_dim, &dim) != KVA_OK || n_tokens < 0 || n_heads <= 0) return KVA_ERR_ARG;
  if (stride < 0 || (stride && (int64_t)stride < (int64_t)n_heads * head_dim)) return KVA_ERR_ARG;
  if (n_tokens == 0 || !kva__rope_active(r)) return KVA_OK;
  if (!x) return KVA_ERR_ARG;
  for (t = 0; t < n_tokens; t++)
    kva__rope_token(r, dim, x + (size_t)t * (stride ? (size_t)stride : (size_t)n_heads * (size_t)head_dim), n_heads,
                    head_dim, pos ? pos[t] : (int32_t)t);
  return KVA_OK;
}

/* In place over x [n_tokens][n_heads][head_dim]; pos NULL => 0..n_tokens-1. */
KVA_API kva_status kva_rope_apply(const kva_rope *r, float *x, int n_tokens, int n_heads, int head_dim,
                                  const int32_t *pos) {
  return kva_rope_apply_strided(r, x, 0, n_tokens, n_heads, head_dim, pos);
}

/* ======================================================================
   [8] paged KV cache: the cache and its layout, slots, the prefix hash
       table, the groups' pools, unpublishing, the block pool, sequences,
       eviction, growing and cutting sequences, prefix caching, sequence
       streams (export / import)
   One pool per layer, indexed by block id; inside a layer's block:
     K [kv_head][slot][head_dim] | V [kv_head][slot][v_dim]
   (LATENT: only K; V is the first v_dim values of each K row).
   Positions live beside the blocks in `block_pos` [layer][block][kv_head][slot]
   (per layer and head: H2O keeps different tokens in each, compacted).
   A sequence's block table lists its block ids in token order; the same id
   addresses every layer. Everything is allocated once, at create.
   ====================================================================== */

/* --- SHA-256 (FIPS 180-4), for the prefix tier's keys: a key names a whole
   token prefix across processes and machines, so it must not collide even
   for token ids chosen to make it --- */

static inline uint32_t kva__ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
static inline void kva__sha256_block(uint32_t h[8], const unsigned char *p) {
  static const uint32_t k[64] = {
      0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
      0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
      0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
      0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
      0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
      0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
      0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
      0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};
  uint32_t w[64], a, b, c, d, e, f, g, hh, t1, t2;
  int i;
  for (i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (i = 16; i < 64; i++)
    w[i] = w[i - 16] + (kva__ror32(w[i - 15], 7) ^ kva__ror32(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
           (kva__ror32(w[i - 2], 17) ^ kva__ror32(w[i - 2], 19) ^ (w[i - 2] >> 10));
  a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (i = 0; i < 64; i++) {
    t1 = hh + (kva__ror32(e, 6) ^ kva__ror32(e, 11) ^ kva__ror32(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
    t2 = (kva__ror32(a, 2) ^ kva__ror32(a, 13) ^ kva__ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}
/* Incremental, so a key's parts need no buffer of their own */
typedef struct {
  uint32_t h[8];
  unsigned char buf[64];
  uint64_t n; /* bytes so far */
} kva__sha256_ctx;
static inline void kva__sha256_init(kva__sha256_ctx *x) {
  static const uint32_t iv[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
  memcpy(x->h, iv, sizeof iv);
  x->n = 0;
}
static inline void kva__sha256_add(kva__sha256_ctx *x, const void *data, size_t n) {
  const unsigned char *p = (const unsigned char *)data;
  while (n > 0) {
    size_t at = (size_t)(x->n % 64), take = 64 - at < n ? 64 - at : n;
    memcpy(x->buf + at, p, take);
    x->n += take, p += take, n -= take;
    if (at + take == 64) kva__sha256_block(x->h, x->buf);
  }
}
static inline void kva__sha256_end(kva__sha256_ctx *x, uint8_t digest[32]) {
  uint64_t bits = x->n * 8;
  unsigned char len[8];
  int i;
  for (i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
  kva__sha256_add(x, "\x80", 1);
  while (x->n % 64 != 56) kva__sha256_add(x, "", 1); /* the string's terminating zero */
  kva__sha256_add(x, len, 8);
  for (i = 0; i < 32; i++) digest[i] = (uint8_t)(x->h[i / 4] >> (24 - 8 * (i % 4)));
}
/* SHA-256 of n bytes: digest [32] */
KVA_API void kva_sha256(const void *data, size_t n, uint8_t digest[32]) {
  kva__sha256_ctx x;
  kva__sha256_init(&x);
  kva__sha256_add(&x, data, n);
  kva__sha256_end(&x, digest);
}
/* The key of the block that ends a prefix: SHA-256 of "kvattn-prefix-1", the
   key of the block before it (parent NULL: the first block, 32 zero bytes),
   the salt as 8 little-endian bytes, then each of its n_tokens token ids as
   4 little-endian bytes. The same on every machine. */
KVA_API void kva_prefix_key(const uint8_t parent[32], uint64_t salt, const int32_t *tokens, int n_tokens,
                            uint8_t key[32]) {
  static const uint8_t none[32] = {0};
  kva__sha256_ctx x;
  unsigned char b[8];
  int i, j;
  kva__sha256_init(&x);
  kva__sha256_add(&x, "kvattn-prefix-1", 15);
  kva__sha256_add(&x, parent ? parent : none, 32);
  for (j = 0; j < 8; j++) b[j] = (unsigned char)(salt >> (8 * j));
  kva__sha256_add(&x, b, 8);
  for (i = 0; tokens && i < n_tokens; i++) {
    uint32_t t = (uint32_t)tokens[i];
    for (j = 0; j < 4; j++) b[j] = (unsigned char)(t >> (8 * j));
    kva__sha256_add(&x, b, 4);
  }
  kva__sha256_end(&x, key);
}
#define KVA__TIER_MAGIC "kvattnPB"
#define KVA__TIER_VERSION 1u
#define KVA__TIER_HEADER 128 /* bytes before the layers' types and scales */

/* --- the cache: its records, shape and layout, create and destroy --- */

typedef struct {
  int gen;          /* the id is gen * max_seqs + index; bumped on free */
  int live;
  int len;          /* tokens held */
  int pos;          /* next absolute position */
  int n_blocks;     /* entries of table in use */
  int last_append;  /* the step: newest tokens that kva_store / kva_attend_cache may address */
  int32_t *stored;  /* [n_layers][2]: the step's tokens stored in each layer, [from, to) of 0..last_append */
  int unstored_from; /* first slot an earlier step left unstored in some layer (INT_MAX: none) */
  kva_evict evict;  /* active policy */
  kva_evict evict_next; /* set by kva_seq_set_evict, active from the next append */
  int32_t *table;   /* [max_table] block ids */
  int32_t *span_table; /* [n_spans][max_table] each WINDOW / CHUNK group's blocks (its own pool's ids;
                          the group's hole where released) */
  int32_t *span_from;  /* [n_spans] blocks [sink blocks, span_from) are released in that group */
  /* the demoted region (kva_evict.demote_dtype): a ring of dm_cap slots in the demoted pool, of which
     dm_len are filled; the next demoted token goes to slot dm_next (over the earliest, once full) */
  int32_t *dm_table;   /* [dm_max_table] its blocks, in the demoted pool */
  int dm_n_blocks, dm_len, dm_next, dm_cap;
  long n_empty;        /* (layer, KV head, slot) triples below len that hold no token (KVA_POS_EMPTY) */
} kva__seq;

/* A WINDOW or CHUNK layer group: its own pool of blocks (ids 0 .. n_blocks-1,
   and n_blocks, the hole: zeros, never written, where a sequence's table
   points for blocks it released, so a kernel's pointers stay valid). A
   block is held by sequence tables and by the publication of a main-pool
   block (prefix caching keeps a window's tokens); a block only a
   publication holds is "spare": taken back when the group runs short. */
typedef struct {
  int kind, window, n_sink, chunk; /* the span (kva_layer_group) */
  int group;                       /* its index in kva_cache_desc.groups */
  int n_blocks, n_free, n_spare;
  int32_t *free;                   /* [n_blocks] stack of free ids */
  int32_t *ref;                    /* [n_blocks + 1] holders */
  int32_t *owner;                  /* [n_blocks + 1] main-pool block whose publication holds it, or -1 */
  int32_t *pub_block;              /* [main pool n_blocks] a published block's block here, or -1 */
  size_t block_bytes;              /* its layers' bytes of one block */
} kva__span;


/* Per block bookkeeping. A block is in at most one list: the free list
   (ref 0, not published) or the cached list (ref 0, published; LRU order). */
typedef struct {
  int32_t ref;              /* sequences whose table holds the block */
  int32_t next, prev;       /* list links */
  int32_t hnext;            /* next block in the same prefix-hash bucket */
  int32_t parent;           /* published: block before it in its chain, -1 for the first */
  int32_t first_child, next_sib, prev_sib; /* published blocks whose parent this is */
  int32_t published;
  uint64_t pub_gen;         /* unique per publication: children name their parent by (id, pub_gen) */
  uint64_t parent_gen, salt, hash;
  long last_use;            /* append counter at the last release or hit */
  uint8_t key[32];          /* published, with a prefix tier: kva_prefix_key of its prefix */
} kva__block;

struct kva_cache {
  kva_cache_kind kind;
  int n_layers, G, D, DV, bs, n_blocks, max_seqs, max_table, n_live; /* max_table: blocks one sequence may hold */
  int evict_support;        /* a kva_evict_support */
  int rotate;               /* KVA_ROTATE_K | KVA_ROTATE_V */
  int bounds;               /* kva_cache_desc.block_bounds */
  float *k_fp8, *v_fp8;     /* [n_layers][G] FP8 scales (1 where not FP8; LATENT: v_fp8 = k_fp8) */
  kva_dtype *kt, *vt;       /* [n_layers] */
  size_t *k_row, *v_row;    /* [n_layers] bytes of one token of one head */
  size_t *v_off;            /* [n_layers] offset of V inside a layer block */
  size_t *layer_block;      /* [n_layers] bytes of one block of one layer */
  unsigned char **pool;     /* [n_layers] */
  int32_t *block_pos;       /* [n_layers][n_blocks][G][bs], NULL: evict_support NONE (position = slot) */
  float *block_score;       /* [n_layers][n_blocks][G][bs] H2O accumulated attention, NULL unless ALL */
  uint16_t *block_bounds;   /* [n_layers][n_blocks + 1][G][2][D] F16 key minimums then maximums, NULL unless
                               kva_cache_desc.block_bounds */
  int32_t *victims;         /* [n_blocks * bs] eviction scratch */
  unsigned char *victim_flag; /* [n_blocks * bs] */
  kva__block *blk;          /* [n_blocks + 2]; sentinels: free list n_blocks, cached list n_blocks+1 */
  int32_t *blk_tokens;      /* [n_blocks][bs] token ids a published block was published under */
  int32_t *buckets;         /* [n_buckets] prefix hash table heads */
  uint64_t bucket_mask, pub_counter;
  int n_free, n_cached, n_used, prefix_max_age;
  long append_counter, prefix_queries, prefix_hits, cow_copies, appends_failed, prefix_forgotten;
  /* the prefix tier (kva_cache_desc.spill / fetch): one record's bytes, a buffer for each direction */
  kva_status (*spill)(void *, const uint8_t *, const void *, size_t);
  kva_status (*fetch)(void *, const uint8_t *, void *, size_t, size_t *);
  void *tier_user;
  size_t tier_bytes;
  unsigned char *tier_out, *tier_in;
  int tier_quiet;           /* kva_cache_reset_prefix: forgetting on purpose, nothing spilled */
  long tier_spills, tier_spill_errors, tier_fetch_hits, tier_fetch_misses, tier_fetch_refused, tier_loads;
  kva__seq *seqs;           /* [max_seqs] */
  int32_t *seq_tables;      /* [max_seqs][n_blocks] their block tables */
  int32_t *seq_stored;      /* [max_seqs][n_layers][2] their kva__seq.stored */
  int n_spans;              /* WINDOW / CHUNK groups */
  kva__span spans[KVA_MAX_GROUPS];
  unsigned char *span_pool_base[KVA_MAX_GROUPS]; /* the span's pool: [its layers][n_blocks + 1][layer block] */
  int32_t *layer_span;      /* [n_layers] a layer's span, -1: FULL (the main pool) */
  int32_t *seq_span_tables; /* [max_seqs][n_spans][max_table] */
  int32_t *seq_span_from;   /* [max_seqs][n_spans] */
  /* the demoted pool (kva_cache_desc.demote_dtype; dm_blocks 0: none), laid out as the main pool
     with one type for every layer: dm_pool [n_layers][dm_blocks][dm_block], positions beside */
  kva_dtype dt;
  int dm_blocks, dm_n_free, dm_max_table;
  size_t dm_k_row, dm_v_row, dm_v_off, dm_block; /* one layer's demoted block */
  unsigned char *dm_pool;
  int32_t *dm_pos;          /* [n_layers][dm_blocks][G][bs] */
  int32_t *dm_free;         /* [dm_blocks] stack of free ids */
  int32_t *seq_dm_tables;   /* [max_seqs][dm_max_table] */
  float *dm_row;            /* [max(D, DV)] a row on its way from one type to the other */
  size_t block_bytes, bytes_meta, alloc_bytes; /* alloc_bytes: the footprint, as asked of the allocator */
  void *(*alloc_fn)(size_t, size_t, void *);
  void (*free_fn)(void *, size_t, void *);
  void *user;
  void (*on_error)(void *, kva_status, const char *, const char *);
  void *raw;                /* the one allocation */
};

/* A refusal: tell the cache's on_error which rule was broken, then return the status. */
static inline kva_status kva__refuse(const kva_cache *c, kva_status status, const char *function, const char *why) {
  if (c && c->on_error) c->on_error(c->user, status, function, why);
  return status;
}
#define KVA__REFUSE(c, broken, status) KVA__REFUSE_WHY(c, broken, status, #broken)
#define KVA__REFUSE_WHY(c, broken, status, why)                      \
  do {                                                              \
    if (broken) return kva__refuse((c), (status), __func__, (why)); \
  } while (0)

static inline kva_dtype kva__resolve_dtype(kva_dtype t) { return t == KVA_DTYPE_DEFAULT ? KVA_F16 : t; }
static inline int kva__dtype_valid(kva_dtype t) { return t >= KVA_DTYPE_DEFAULT && t <= KVA_INT4; }


/* Storage types of layer l; 0 if the description's types are invalid. */
static inline int kva__layer_types(const kva_cache_desc *d, int l, kva_dtype *kt, kva_dtype *vt) {
  kva_dtype k = d->dtype, v = d->v_dtype;
  if (d->layer_dtype) k = v = d->layer_dtype[l];
  if (!kva__dtype_valid(k) || !kva__dtype_valid(v)) return 0;
  k = kva__resolve_dtype(k);
  v = v == KVA_DTYPE_DEFAULT ? k : v;
  if (d->kind == KVA_CACHE_LATENT) v = k;
  *kt = k;
  *vt = v;
  return 1;
}

static inline int kva__is_fp8(kva_dtype t) { return t == KVA_FP8_E4M3 || t == KVA_FP8_E5M2; }

/* The FP8 scale of layer l, KV head g, for K (is_v 0) or V: the most
   specific one the description gives. */
static inline float kva__desc_fp8_scale(const kva_cache_desc *d, int is_v, int l, int g) {
  const float *head = is_v ? d->head_v_scale : d->head_k_scale, *layer = is_v ? d->layer_v_scale : d->layer_k_scale;
  if (head) return head[(size_t)l * (size_t)d->n_kv_heads + (size_t)g];
  if (layer) return layer[l];
  return is_v ? d->v_scale : d->k_scale;
}

/* An FP8 scale must be > 0 and finite; E4M3 folds x256 into it inside the
   kernels, which must stay finite too. Non-FP8 types take any value. */
static inline kva_status kva__fp8_scale_check(kva_dtype t, float scale) {
  if (!kva__is_fp8(t)) return KVA_OK;
  if (!(scale > 0.0f) || !(scale <= FLT_MAX)) return KVA_ERR_ARG;
  if (t == KVA_FP8_E4M3 && scale > FLT_MAX / 512.0f) return KVA_ERR_UNSUPPORTED;
  return KVA_OK;
}

static inline int kva__desc_shape_ok(const kva_cache_desc *d) {
  if (!d || (d->kind != KVA_CACHE_KV && d->kind != KVA_CACHE_LATENT)) return 0;
  if (d->n_layers <= 0 || d->n_kv_heads <= 0 || d->head_dim <= 0 || d->v_dim < 0) return 0;
  if (d->n_layers > (1 << 16) || d->n_kv_heads > (1 << 16) || d->head_dim > (1 << 16) || d->v_dim > (1 << 16))
    return 0;
  if (d->kind == KVA_CACHE_LATENT && d->v_dim > d->head_dim) return 0;
  return 1;
}

/* Stored bytes of one token over all layers: K, V (once for LATENT), scales. */
KVA_API size_t kva_cache_bytes_per_token(const kva_cache_desc *d) {
  size_t total = 0;
  int l, dv;
  if (!kva__desc_shape_ok(d)) return 0;
  dv = d->v_dim ? d->v_dim : d->head_dim;
  for (l = 0; l < d->n_layers; l++) {
    kva_dtype kt = KVA_F16, vt = KVA_F16;
    if (!kva__layer_types(d, l, &kt, &vt)) return 0;
    total += (size_t)d->n_kv_heads * kva__row_bytes(kt, d->head_dim);
    if (d->kind == KVA_CACHE_KV) total += (size_t)d->n_kv_heads * kva__row_bytes(vt, dv);
  }
  if (d->block_bounds == 1) { /* each block's F16 minimum and maximum per channel, over its tokens, rounded up */
    size_t bs = (size_t)(d->block_size > 0 ? d->block_size : 16),
           per_block = (size_t)d->n_layers * (size_t)d->n_kv_heads * 4 * (size_t)d->head_dim;
    total += (per_block + bs - 1) / bs;
  }
  return total;
}

static inline size_t kva__align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Typed regions carved one after another out of one block of memory, each
   64-byte aligned. A layout function runs twice: with base NULL it only
   measures (every region comes back NULL), then with the allocated block it
   hands out the same regions. */
typedef struct {
  unsigned char *base;
  size_t size;     /* bytes carved so far */
  int overflow;    /* a size did not fit in size_t */
} kva__layout;
static inline void *kva__carve(kva__layout *L, size_t count, size_t elem_bytes) {
  size_t off = kva__align64(L->size), bytes = count * elem_bytes;
  if (off < L->size || (elem_bytes && bytes / elem_bytes != count) || off + bytes < off) {
    L->overflow = 1;
    return NULL;
  }
  L->size = off + bytes;
  return L->base ? L->base + off : NULL;
}

/* Intrusive circular doubly linked lists over block ids: O(1) push,
   pop and remove-from-middle. */
#define KVA__FREE_LIST(c) ((c)->n_blocks)
#define KVA__CACHED_LIST(c) ((c)->n_blocks + 1)
static inline void kva__list_remove(kva_cache *c, int b) {
  c->blk[c->blk[b].prev].next = c->blk[b].next;
  c->blk[c->blk[b].next].prev = c->blk[b].prev;
}
static inline void kva__list_push_back(kva_cache *c, int list, int b) {
  int last = c->blk[list].prev;
  c->blk[last].next = b;
  c->blk[b].prev = last;
  c->blk[b].next = list;
  c->blk[list].prev = b;
}

/* Bytes of one layer: a token's row of one head for K and V, and a block
   (all heads, bs tokens: K, then V from a 64-byte boundary, the block
   itself a multiple of 64 bytes). */
typedef struct {
  size_t k_row, v_row, v_off, block;
} kva__layer_bytes;
static inline kva__layer_bytes kva__layer_geometry(int kind, kva_dtype kt, kva_dtype vt, int D, int DV, int G,
                                                   int bs) {
  kva__layer_bytes b;
  size_t slots = (size_t)G * (size_t)bs;
  b.k_row = kva__row_bytes(kt, D);
  b.v_row = kind == KVA_CACHE_KV ? kva__row_bytes(vt, DV) : b.k_row;
  b.v_off = kind == KVA_CACHE_KV ? kva__align64(b.k_row * slots) : 0;
  b.block = kind == KVA_CACHE_KV ? b.v_off + kva__align64(b.v_row * slots) : kva__align64(b.k_row * slots);
  return b;
}

/* The cache's one allocation: the struct, per-layer tables, block and
   sequence bookkeeping, then the pool (returned). */
static inline unsigned char *kva__cache_layout(kva__layout *L, kva_cache *c, size_t n_buckets) {
  size_t layers = (size_t)c->n_layers, blocks = (size_t)c->n_blocks, slots = blocks * (size_t)c->bs;
  unsigned char *pool;
  int i;
  kva__carve(L, 1, sizeof(kva_cache));
  c->kt = (kva_dtype *)kva__carve(L, layers, sizeof(kva_dtype));
  c->vt = (kva_dtype *)kva__carve(L, layers, sizeof(kva_dtype));
  c->k_row = (size_t *)kva__carve(L, layers, sizeof(size_t));
  c->v_row = (size_t *)kva__carve(L, layers, sizeof(size_t));
  c->v_off = (size_t *)kva__carve(L, layers, sizeof(size_t));
  c->layer_block = (size_t *)kva__carve(L, layers, sizeof(size_t));
  c->pool = (unsigned char **)kva__carve(L, layers, sizeof(unsigned char *));
  c->block_pos = c->evict_support == KVA_EVICT_SUPPORT_NONE
                     ? NULL
                     : (int32_t *)kva__carve(L, layers * slots * (size_t)c->G, sizeof(int32_t));
  c->block_score = c->evict_support != KVA_EVICT_SUPPORT_ALL
                       ? NULL
                       : (float *)kva__carve(L, layers * slots * (size_t)c->G, sizeof(float));
  c->block_bounds =
      !c->bounds ? NULL
                 : (uint16_t *)kva__carve(L, layers * (blocks + 1) * (size_t)c->G * 2 * (size_t)c->D, sizeof(uint16_t));
  c->victims = (int32_t *)kva__carve(L, slots, sizeof(int32_t));
  c->victim_flag = (unsigned char *)kva__carve(L, slots, 1);
  c->blk = (kva__block *)kva__carve(L, blocks + 2, sizeof(kva__block));
  c->blk_tokens = (int32_t *)kva__carve(L, slots, sizeof(int32_t));
  c->buckets = (int32_t *)kva__carve(L, n_buckets, sizeof(int32_t));
  c->seqs = (kva__seq *)kva__carve(L, (size_t)c->max_seqs, sizeof(kva__seq));
  c->seq_tables = (int32_t *)kva__carve(L, (size_t)c->max_seqs * (size_t)c->max_table, sizeof(int32_t));
  c->seq_stored = (int32_t *)kva__carve(L, (size_t)c->max_seqs * layers * 2, sizeof(int32_t));
  c->k_fp8 = (float *)kva__carve(L, layers * (size_t)c->G, sizeof(float));
  c->v_fp8 = (float *)kva__carve(L, layers * (size_t)c->G, sizeof(float));
  c->layer_span = (int32_t *)kva__carve(L, layers, sizeof(int32_t));
  c->seq_span_tables =
      (int32_t *)kva__carve(L, (size_t)c->max_seqs * (size_t)c->n_spans * (size_t)c->max_table, sizeof(int32_t));
  c->seq_span_from = (int32_t *)kva__carve(L, (size_t)c->max_seqs * (size_t)c->n_spans, sizeof(int32_t));
  for (i = 0; i < c->n_spans; i++) {
    kva__span *sp = &c->spans[i];
    size_t n = (size_t)sp->n_blocks;
    sp->free = (int32_t *)kva__carve(L, n, sizeof(int32_t));
    sp->ref = (int32_t *)kva__carve(L, n + 1, sizeof(int32_t));
    sp->owner = (int32_t *)kva__carve(L, n + 1, sizeof(int32_t));
    sp->pub_block = (int32_t *)kva__carve(L, blocks, sizeof(int32_t));
  }
  c->dm_pos = (int32_t *)kva__carve(L, layers * (size_t)c->dm_blocks * (size_t)c->G * (size_t)c->bs, sizeof(int32_t));
  c->dm_free = (int32_t *)kva__carve(L, (size_t)c->dm_blocks, sizeof(int32_t));
  c->seq_dm_tables = (int32_t *)kva__carve(L, (size_t)c->max_seqs * (size_t)c->dm_max_table, sizeof(int32_t));
  c->dm_row = (float *)kva__carve(L, (size_t)(c->D > c->DV ? c->D : c->DV), sizeof(float));
  c->tier_out = (unsigned char *)kva__carve(L, c->tier_bytes, 1);
  c->tier_in = (unsigned char *)kva__carve(L, c->tier_bytes, 1);
  pool = (unsigned char *)kva__carve(L, blocks, c->block_bytes);
  for (i = 0; i < c->n_spans; i++) /* block data last: create leaves it uninitialised */
    c->span_pool_base[i] = (unsigned char *)kva__carve(L, (size_t)c->spans[i].n_blocks + 1, c->spans[i].block_bytes);
  c->dm_pool = (unsigned char *)kva__carve(L, layers * (size_t)c->dm_blocks, c->dm_block);
  return pool;
}

/* Blocks of a span one sequence holds at most while it appends a block at a
   time: the sinks', the reach of its newest query, the block being filled. */
static inline long kva__span_seq_blocks(const kva__span *sp, int bs) {
  long sinks = sp->kind == KVA_SPAN_WINDOW ? ((long)sp->n_sink + bs - 1) / bs : 0;
  long reach = sp->kind == KVA_SPAN_WINDOW ? sp->window : sp->chunk;
  return sinks + (reach + bs - 2) / bs + 2;
}

/* The whole footprint of a cache of `shape` with n_blocks blocks: what is
   asked of the allocator (KVATTN_MALLOC: 64 bytes more, to align by hand);
   SIZE_MAX if it does not fit in size_t. Sets the shape's n_blocks and
   max_table, and *n_buckets. */
static inline size_t kva__cache_footprint(const kva_cache_desc *d, kva_cache *shape, int n_blocks, size_t *n_buckets) {
  kva__layout L;
  size_t extra = d->alloc_fn ? 0 : 64;
  long table = d->max_seq_len > 0 ? ((long)d->max_seq_len + shape->bs - 1) / shape->bs : n_blocks;
  int i;
  shape->n_blocks = n_blocks;
  shape->max_table = table < n_blocks ? (int)table : n_blocks;
  if (shape->dt != KVA_DTYPE_DEFAULT) {
    shape->dm_blocks = d->demote_blocks ? d->demote_blocks : n_blocks;
    shape->dm_max_table = table < shape->dm_blocks ? (int)table : shape->dm_blocks;
  }
  for (i = 0; i < shape->n_spans; i++) {
    kva__span *sp = &shape->spans[i];
    long derived = (long)shape->max_seqs * kva__span_seq_blocks(sp, shape->bs);
    sp->n_blocks = d->groups[sp->group].n_blocks ? d->groups[sp->group].n_blocks
                   : derived < n_blocks         ? (int)derived
                                                : n_blocks;
  }
  *n_buckets = 1;
  while (*n_buckets < (size_t)n_blocks) *n_buckets <<= 1;
  if (shape->block_bytes > ((size_t)-1) / 4 / (size_t)n_blocks) return (size_t)-1;
  if (shape->dm_blocks && shape->dm_block > ((size_t)-1) / 4 / (size_t)shape->dm_blocks / (size_t)shape->n_layers)
    return (size_t)-1;
  L.base = NULL, L.size = 0, L.overflow = 0;
  kva__cache_layout(&L, shape, *n_buckets);
  if (L.overflow || L.size > (size_t)-1 - extra) return (size_t)-1;
  return L.size + extra;
}

/* A refused description: tell its on_error which rule was broken. */
static inline kva_status kva__refuse_desc(const kva_cache_desc *d, kva_status status, const char *function,
                                          const char *why) {
  if (d && d->on_error) d->on_error(d->user, status, function, why);
  return status;
}
#define KVA__DESC_RULE(d, broken, status)                                   \
  do {                                                                      \
    if (broken) return kva__refuse_desc((d), (status), __func__, #broken); \
  } while (0)

/* The description's WINDOW / CHUNK groups, as the shape's spans (their pool
   sizes come later, with the main pool's). */
static inline kva_status kva__desc_spans(const kva_cache_desc *d, kva_cache *shape) {
  int i, l;
  KVA__DESC_RULE(d, d->n_groups < 0 || d->n_groups > KVA_MAX_GROUPS, KVA_ERR_ARG);
  KVA__DESC_RULE(d, (d->n_groups > 0) != (d->groups != NULL), KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->layer_group && d->n_groups == 0, KVA_ERR_ARG);
  for (l = 0; d->layer_group && l < d->n_layers; l++)
    KVA__DESC_RULE(d, d->layer_group[l] < 0 || d->layer_group[l] >= d->n_groups, KVA_ERR_ARG);
  for (i = 0; i < d->n_groups; i++) {
    const kva_layer_group *gr = &d->groups[i];
    kva__span *sp = &shape->spans[shape->n_spans];
    KVA__DESC_RULE(d, gr->n_blocks < 0 || gr->n_blocks > INT32_MAX / 4, KVA_ERR_ARG);
    KVA__DESC_RULE(d, gr->window < 0 || gr->n_sink < 0 || gr->chunk_size < 0, KVA_ERR_ARG);
    if (gr->kind == KVA_SPAN_FULL) {
      KVA__DESC_RULE(d, gr->window || gr->n_sink || gr->chunk_size || gr->n_blocks, KVA_ERR_ARG);
      continue;
    }
    KVA__DESC_RULE(d, gr->kind == KVA_SPAN_WINDOW && (gr->window == 0 || gr->chunk_size), KVA_ERR_ARG);
    KVA__DESC_RULE(d, gr->kind == KVA_SPAN_CHUNK && (gr->chunk_size == 0 || gr->window || gr->n_sink), KVA_ERR_ARG);
    KVA__DESC_RULE(d, gr->kind != KVA_SPAN_WINDOW && gr->kind != KVA_SPAN_CHUNK, KVA_ERR_ARG);
    memset(sp, 0, sizeof *sp);
    sp->kind = gr->kind;
    sp->window = gr->window;
    sp->n_sink = gr->n_sink;
    sp->chunk = gr->chunk_size;
    sp->group = i;
    shape->n_spans++;
  }
  if (shape->n_spans > 0) shape->evict_support = KVA_EVICT_SUPPORT_NONE; /* slots stay positions */
  return KVA_OK;
}

/* Layer l's span in the shape, -1: FULL. */
static inline int kva__desc_layer_span(const kva_cache_desc *d, const kva_cache *shape, int l) {
  int g = d->layer_group ? d->layer_group[l] : 0, i;
  for (i = 0; i < shape->n_spans; i++)
    if (shape->spans[i].group == g) return i;
  return -1;
}

/* Checks a description and computes the cache's shape: the pool size is
   n_blocks, or the most blocks whose whole footprint fits max_bytes. */
static inline kva_status kva__cache_shape(const kva_cache_desc *d, kva_cache *shape, size_t *n_buckets,
                                          size_t *footprint) {
  int l, i;
  if (!kva__desc_shape_ok(d))
    return kva__refuse_desc(d, KVA_ERR_ARG, __func__, "kind, n_layers, n_kv_heads, head_dim or v_dim is out of range");
  KVA__DESC_RULE(d, d->block_size < 0 || d->n_blocks < 0 || d->max_seqs < 0, KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->prefix_max_age < 0 || d->max_seq_len < 0, KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->evict_support < KVA_EVICT_SUPPORT_ALL || d->evict_support > KVA_EVICT_SUPPORT_NONE, KVA_ERR_ARG);
  KVA__DESC_RULE(d, (d->alloc_fn == NULL) != (d->free_fn == NULL), KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->n_blocks == 0 && d->max_bytes == 0, KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->rotate < 0 || d->rotate > (KVA_ROTATE_K | KVA_ROTATE_V), KVA_ERR_ARG);
  KVA__DESC_RULE(d, d->rotate && d->kind == KVA_CACHE_LATENT, KVA_ERR_UNSUPPORTED); /* V is a prefix of K there */
  KVA__DESC_RULE(d, d->block_bounds < 0 || d->block_bounds > 1, KVA_ERR_ARG);
  KVA__DESC_RULE(d, (d->spill == NULL) != (d->fetch == NULL), KVA_ERR_ARG);
  /* a tier record holds one main-pool block: a group's blocks live elsewhere, a latent row has no V */
  KVA__DESC_RULE(d, d->spill && (d->n_groups > 0 || d->kind == KVA_CACHE_LATENT), KVA_ERR_UNSUPPORTED);
  KVA__DESC_RULE(d, !kva__dtype_valid(d->demote_dtype) || d->demote_blocks < 0 || d->demote_blocks > INT32_MAX / 4,
                 KVA_ERR_ARG);
  /* demoted rows carry their own scales (INT8, INT4) or need none; FP8 would need a scale per row */
  KVA__DESC_RULE(d, kva__is_fp8(d->demote_dtype), KVA_ERR_UNSUPPORTED);
  KVA__DESC_RULE(d, d->demote_dtype && (d->kind == KVA_CACHE_LATENT || d->n_groups > 0 ||
                                        d->evict_support == KVA_EVICT_SUPPORT_NONE),
                 KVA_ERR_UNSUPPORTED);
  memset(shape, 0, sizeof *shape);
  shape->kind = (kva_cache_kind)d->kind;
  shape->n_layers = d->n_layers;
  shape->G = d->n_kv_heads;
  shape->D = d->head_dim;
  shape->DV = d->v_dim ? d->v_dim : d->head_dim;
  shape->bs = d->block_size ? d->block_size : 16;
  shape->max_seqs = d->max_seqs ? d->max_seqs : 256;
  shape->evict_support = d->evict_support;
  shape->rotate = d->rotate;
  shape->bounds = d->block_bounds;
  shape->dt = d->demote_dtype;
  if (shape->dt != KVA_DTYPE_DEFAULT) {
    kva__layer_bytes b = kva__layer_geometry(KVA_CACHE_KV, shape->dt, shape->dt, shape->D, shape->DV, shape->G,
                                             shape->bs);
    shape->dm_k_row = b.k_row, shape->dm_v_row = b.v_row, shape->dm_v_off = b.v_off, shape->dm_block = b.block;
  }
  KVA__DESC_RULE(d, shape->bs > (1 << 20) || shape->max_seqs > (1 << 20), KVA_ERR_ARG);
  if (kva__desc_spans(d, shape) != KVA_OK) return KVA_ERR_ARG; /* it said why */
  for (l = 0; l < d->n_layers; l++) { /* validate the types; the bytes of one block over all layers */
    kva_dtype kt, vt;
    size_t bytes;
    int span = kva__desc_layer_span(d, shape, l);
    if (!kva__layer_types(d, l, &kt, &vt))
      return kva__refuse_desc(d, KVA_ERR_ARG, __func__, "a layer's key or value storage type is invalid");
    for (i = 0; i < d->n_kv_heads; i++) {
      kva_status st = kva__fp8_scale_check(kt, kva__desc_fp8_scale(d, 0, l, i));
      if (st == KVA_OK && d->kind == KVA_CACHE_KV) st = kva__fp8_scale_check(vt, kva__desc_fp8_scale(d, 1, l, i));
      if (st != KVA_OK) /* LATENT stores one vector: K's scales only */
        return kva__refuse_desc(d, st, __func__, "an FP8 scale is not a positive finite float (or too large for E4M3)");
    }
    bytes = kva__layer_geometry(d->kind, kt, vt, shape->D, shape->DV, shape->G, shape->bs).block;
    if (d->spill) /* a tier record: the layer's types and scales, then its K and V rows */
      shape->tier_bytes += 8 + 8 * (size_t)shape->G +
                           (size_t)shape->G * (size_t)shape->bs * (kva__row_bytes(kt, shape->D) + kva__row_bytes(vt, shape->DV));
    if (span < 0) shape->block_bytes += bytes;
    else shape->spans[span].block_bytes += bytes;
  }
  if (d->spill) shape->tier_bytes += KVA__TIER_HEADER + 4 * (size_t)shape->bs + 8; /* header, token ids, checksum */
  if (d->n_blocks) {
    KVA__DESC_RULE(d, (size_t)d->n_blocks > (size_t)INT32_MAX / 4, KVA_ERR_ARG);
    *footprint = kva__cache_footprint(d, shape, d->n_blocks, n_buckets);
    if (*footprint == (size_t)-1) return kva__refuse_desc(d, KVA_ERR_NOMEM, __func__, "the footprint overflows size_t");
    return KVA_OK;
  } else { /* the footprint grows with n_blocks: the largest that fits, by bisection */
    size_t most = d->max_bytes / (shape->block_bytes ? shape->block_bytes : 1);
    int lo = 1, hi = most > (size_t)INT32_MAX / 4 ? INT32_MAX / 4 : (int)most;
    if (hi < 1 || kva__cache_footprint(d, shape, 1, n_buckets) > d->max_bytes)
      return kva__refuse_desc(d, KVA_ERR_ARG, __func__, "max_bytes holds not even one block and its bookkeeping");
    while (lo < hi) {
      int mid = lo + (hi - lo + 1) / 2;
      if (kva__cache_footprint(d, shape, mid, n_buckets) <= d->max_bytes) lo = mid;
      else hi = mid - 1;
    }
    *footprint = kva__cache_footprint(d, shape, lo, n_buckets);
    return KVA_OK;
  }
}

KVA_API kva_status kva_cache_size(const kva_cache_desc *d, size_t *bytes) {
  kva_cache shape;
  size_t n_buckets, footprint = 0;
  kva_status st;
  if (!bytes) return KVA_ERR_ARG;
  st = kva__cache_shape(d, &shape, &n_buckets, &footprint);
  if (st == KVA_OK) *bytes = footprint;
  return st;
}

KVA_API kva_status kva_cache_create(const kva_cache_desc *d, kva_cache **out) {
  kva_cache shape, *c;
  kva__layout L;
  void *allocated; /* what free_fn / KVATTN_FREE gets back */
  size_t n_buckets = 1, data, footprint;
  int l, i;
  unsigned char *raw, *pool;
  kva_status st;
  if (!out) return KVA_ERR_ARG;
  st = kva__cache_shape(d, &shape, &n_buckets, &footprint);
  if (st != KVA_OK) return st;
  if (d->alloc_fn) allocated = raw = (unsigned char *)d->alloc_fn(footprint, 64, d->user);
  else { /* malloc promises less than 64-byte alignment: footprint has 64 bytes to align by hand */
    unsigned char *r = (unsigned char *)KVATTN_MALLOC(footprint);
    allocated = r;
    raw = r ? r + (64 - ((uintptr_t)r & 63)) : NULL;
  }
  if (!raw) return kva__refuse_desc(d, KVA_ERR_NOMEM, __func__, "the allocator returned NULL for the cache");
  c = (kva_cache *)raw;
  *c = shape;
  L.base = raw, L.size = 0;
  pool = kva__cache_layout(&L, c, n_buckets);
  KVATTN_ASSERT(L.size + (d->alloc_fn ? 0 : 64) == footprint);
  data = (size_t)(pool - raw);
  /* bookkeeping only: block data is zeroed as slots are appended */
  memset(raw + sizeof(kva_cache), 0, data - sizeof(kva_cache));
  c->raw = allocated;
  c->alloc_fn = d->alloc_fn;
  c->free_fn = d->free_fn;
  c->user = d->user;
  c->on_error = d->on_error;
  c->spill = d->spill;
  c->fetch = d->fetch;
  c->tier_user = d->tier_user;
  c->alloc_bytes = footprint; /* what was asked of the allocator */
  c->bytes_meta = data;
  c->bucket_mask = (uint64_t)n_buckets - 1;
  c->prefix_max_age = d->prefix_max_age;
  for (i = 0; i < (int)n_buckets; i++) c->buckets[i] = -1;
  for (l = 0; l < c->n_layers; l++) {
    kva__layer_bytes b;
    kva__layer_types(d, l, &c->kt[l], &c->vt[l]); /* validated above */
    b = kva__layer_geometry((int)c->kind, c->kt[l], c->vt[l], c->D, c->DV, c->G, c->bs);
    c->k_row[l] = b.k_row;
    c->v_row[l] = b.v_row;
    c->v_off[l] = b.v_off;
    c->layer_block[l] = b.block;
    for (i = 0; i < c->G; i++) {
      size_t at = (size_t)l * (size_t)c->G + (size_t)i;
      c->k_fp8[at] = kva__is_fp8(c->kt[l]) ? kva__desc_fp8_scale(d, 0, l, i) : 1.0f;
      c->v_fp8[at] = c->kind == KVA_CACHE_LATENT ? c->k_fp8[at]
                     : kva__is_fp8(c->vt[l])    ? kva__desc_fp8_scale(d, 1, l, i)
                                                : 1.0f;
    }
    c->layer_span[l] = kva__desc_layer_span(d, c, l);
    if (c->layer_span[l] < 0) {
      c->pool[l] = pool;
      pool += c->layer_block[l] * (size_t)c->n_blocks;
    } else { /* the span's pool: this layer's region, its hole zeroed */
      kva__span *sp = &c->spans[c->layer_span[l]];
      c->pool[l] = c->span_pool_base[c->layer_span[l]];
      c->span_pool_base[c->layer_span[l]] += c->layer_block[l] * ((size_t)sp->n_blocks + 1);
      memset(c->pool[l] + c->layer_block[l] * (size_t)sp->n_blocks, 0, c->layer_block[l]);
    }
  }
  for (i = 0; i < c->n_spans; i++) {
    kva__span *sp = &c->spans[i];
    int b;
    for (b = 0; b < sp->n_blocks; b++) sp->free[b] = sp->n_blocks - 1 - b; /* taken lowest id first */
    sp->n_free = sp->n_blocks;
    for (b = 0; b <= sp->n_blocks; b++) sp->owner[b] = -1;
    for (b = 0; b < c->n_blocks; b++) sp->pub_block[b] = -1;
  }
  for (i = 0; i < c->max_seqs; i++) {
    c->seqs[i].table = c->seq_tables + (size_t)i * (size_t)c->max_table;
    c->seqs[i].stored = c->seq_stored + (size_t)i * (size_t)c->n_layers * 2;
    c->seqs[i].span_table = c->seq_span_tables + (size_t)i * (size_t)c->n_spans * (size_t)c->max_table;
    c->seqs[i].span_from = c->seq_span_from + (size_t)i * (size_t)c->n_spans;
    c->seqs[i].dm_table = c->seq_dm_tables + (size_t)i * (size_t)c->dm_max_table;
  }
  for (i = 0; i < c->dm_blocks; i++) c->dm_free[i] = c->dm_blocks - 1 - i; /* taken lowest id first */
  c->dm_n_free = c->dm_blocks;
  for (i = 0; i < c->n_blocks; i++) c->blk[i].first_child = -1;
  for (i = c->n_blocks; i < c->n_blocks + 2; i++) c->blk[i].next = c->blk[i].prev = i;
  for (i = 0; i < c->n_blocks; i++) kva__list_push_back(c, KVA__FREE_LIST(c), i);
  c->n_free = c->n_blocks;
  *out = c;
  return KVA_OK;
}

KVA_API void kva_cache_destroy(kva_cache *c) {
  if (!c) return;
  if (c->free_fn) c->free_fn(c->raw, c->alloc_bytes, c->user);
  else KVATTN_FREE(c->raw);
}

/* --- slots: where a sequence's token sits, layer by layer --- */

static inline int kva__blocks_for(const kva_cache *c, long tokens) { return (int)((tokens + c->bs - 1) / c->bs); }

/* The block ids layer l finds sequence s's tokens under: the main table, or
   its span's (WINDOW / CHUNK group). */
static inline int32_t *kva__span_table(const kva_cache *c, const kva__seq *s, int span) {
  return s->span_table + (size_t)span * (size_t)c->max_table;
}
static inline int32_t *kva__layer_table(const kva_cache *c, const kva__seq *s, int l) {
  return c->layer_span[l] < 0 ? s->table : kva__span_table(c, s, c->layer_span[l]);
}

/* Token `slot` of sequence s in layer l: its block id and the slot inside the block. */
static inline int32_t kva__slot_block(const kva_cache *c, const kva__seq *s, int l, int slot, int *in_block) {
  *in_block = slot % c->bs;
  return kva__layer_table(c, s, l)[slot / c->bs];
}

static inline unsigned char *kva__k_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->pool[l] + (size_t)b * c->layer_block[l] + ((size_t)g * (size_t)c->bs + (size_t)slot) * c->k_row[l];
}
static inline unsigned char *kva__v_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->pool[l] + (size_t)b * c->layer_block[l] + c->v_off[l] +
         ((size_t)g * (size_t)c->bs + (size_t)slot) * c->v_row[l];
}
/* Index of a slot's position and H2O score: [layer][block][kv_head][slot] */
static inline size_t kva__slot_index(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return (((size_t)l * (size_t)c->n_blocks + (size_t)b) * (size_t)c->G + (size_t)g) * (size_t)c->bs + (size_t)slot;
}
static inline int32_t *kva__pos_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->block_pos + kva__slot_index(c, l, b, g, slot);
}
static inline float *kva__score_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->block_score + kva__slot_index(c, l, b, g, slot);
}

/* --- block key bounds (kva_cache_desc.block_bounds) ---
   Per block, layer and KV head, lo[i] <= every stored key's channel i <=
   hi[i], as F16s rounded outward from the keys as stored (read back as the
   kernels see them: after RoPE, rotation and quantization). A block's
   first slot resets them; each store widens them; compaction, accept and
   import rebuild them from the held slots. Overwritten or truncated keys
   may stay inside (a looser bound, never a tighter one). */
static inline uint16_t *kva__bounds_ptr(const kva_cache *c, int l, int32_t b, int g) {
  /* n_blocks + 1 per layer: a WINDOW / CHUNK group's pool ends in its hole (kva__span_hole) */
  return c->block_bounds +
         (((size_t)l * ((size_t)c->n_blocks + 1) + (size_t)b) * (size_t)c->G + (size_t)g) * 2 * (size_t)c->D;
}
/* F16 bits in an order that compares as their values do (-0 just below +0) */
static inline unsigned kva__f16_order(uint16_t h) { return (h & 0x8000u) ? (unsigned)(uint16_t)~h : h | 0x8000u; }
/* Are these bounds (D minimums, then D maximums) still reset: no key added? */
static inline int kva__bounds_empty(const uint16_t *lohi, int D) {
  int i;
  for (i = 0; i < D; i++)
    if (lohi[i] != 0x7C00u || lohi[D + i] != 0xFC00u) return 0;
  return 1;
}
static inline void kva__bounds_reset(kva_cache *c, int l, int32_t b, int g) {
  uint16_t *lo = kva__bounds_ptr(c, l, b, g);
  int i;
  for (i = 0; i < c->D; i++) lo[i] = 0x7C00u, lo[c->D + i] = 0xFC00u; /* +Inf, -Inf: nothing yet */
}
/* Widen block b's bounds (layer l, head g) by the key stored in `slot`. NaN
   channels are left out. */
static inline void kva__bounds_add(kva_cache *c, int l, int32_t b, int g, int slot) {
  uint16_t *lo = kva__bounds_ptr(c, l, b, g), *hi = lo + c->D;
  const void *row = kva__k_ptr(c, l, b, g, slot);
  const kva_dtype t = c->kt[l];
  const float fs = c->k_fp8[(size_t)l * (size_t)c->G + (size_t)g];
  float x[64]; /* the row read back a chunk at a time */
  int i;
  for (i = 0; i < c->D; i++) {
    uint16_t down, up;
    if (t == KVA_F16) { /* exact already */
      memcpy(&down, (const uint16_t *)row + i, sizeof down);
      if ((down & 0x7C00u) == 0x7C00u && (down & 0x03FFu)) continue;
      up = down;
    } else {
      if (i % 64 == 0) kva__load_elems(t, x, row, i, c->D - i < 64 ? c->D - i : 64, fs);
      if (x[i % 64] != x[i % 64]) continue;
      down = kva__f16_floor((double)x[i % 64]);
      up = kva__f16_ceil((double)x[i % 64]);
    }
    if (kva__f16_order(down) < kva__f16_order(lo[i])) lo[i] = down;
    if (kva__f16_order(up) > kva__f16_order(hi[i])) hi[i] = up;
  }
}
/* Rebuild the bounds of every block of s in layer l from its held slots. */
static inline void kva__bounds_rebuild(kva_cache *c, const kva__seq *s, int l) {
  const int32_t *table = kva__layer_table(c, s, l);
  int i, g, slot, nb = (s->len + c->bs - 1) / c->bs;
  for (i = 0; i < nb; i++)
    for (g = 0; g < c->G; g++) {
      int held = s->len - i * c->bs < c->bs ? s->len - i * c->bs : c->bs;
      kva__bounds_reset(c, l, table[i], g);
      for (slot = 0; slot < held; slot++)
        if (!c->block_pos || *kva__pos_ptr(c, l, table[i], g, slot) != KVA_POS_EMPTY) kva__bounds_add(c, l, table[i], g, slot);
    }
}

/* Token `slot` of s in every layer and head: zero data and score, set position. */
static inline void kva__slot_init(kva_cache *c, const kva__seq *s, int token, int32_t pos) {
  int l, g, slot;
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++) {
      int32_t b = kva__slot_block(c, s, l, token, &slot);
      memset(kva__k_ptr(c, l, b, g, slot), 0, c->k_row[l]);
      if (c->kind == KVA_CACHE_KV) memset(kva__v_ptr(c, l, b, g, slot), 0, c->v_row[l]);
      if (c->block_pos) *kva__pos_ptr(c, l, b, g, slot) = pos;
      if (c->block_score) *kva__score_ptr(c, l, b, g, slot) = 0.0f;
      if (c->block_bounds && slot == 0) kva__bounds_reset(c, l, b, g); /* a block begun */
    }
}

/* One head's token moves from one slot to another (eviction compaction). */
static inline void kva__slot_move(kva_cache *c, int l, int g, int32_t db, int ds, int32_t sb, int ss) {
  memcpy(kva__k_ptr(c, l, db, g, ds), kva__k_ptr(c, l, sb, g, ss), c->k_row[l]);
  if (c->kind == KVA_CACHE_KV) memcpy(kva__v_ptr(c, l, db, g, ds), kva__v_ptr(c, l, sb, g, ss), c->v_row[l]);
  *kva__pos_ptr(c, l, db, g, ds) = *kva__pos_ptr(c, l, sb, g, ss); /* eviction: positions are kept */
  if (c->block_score) *kva__score_ptr(c, l, db, g, ds) = *kva__score_ptr(c, l, sb, g, ss);
}

/* --- prefix hash table --- */

/* The key of a published block: its parent publication, the salt and its
   token ids. The hash only picks a bucket; hits compare everything. */
static inline uint64_t kva__prefix_hash(int32_t parent, uint64_t parent_gen, uint64_t salt, const int32_t *tokens,
                                        int n) {
#ifdef KVATTN_TEST_WEAK_HASH /* tests: every key collides, so only the full comparison separates them */
  (void)parent; (void)parent_gen; (void)salt; (void)tokens; (void)n;
  return 7;
#else
  uint64_t h = 0x9e3779b97f4a7c15ull ^ salt;
  int i;
  h = (h ^ (uint64_t)(uint32_t)parent) * 0x100000001b3ull;
  h = (h ^ parent_gen) * 0xff51afd7ed558ccdull;
  for (i = 0; i < n; i++) {
    h ^= (uint64_t)(uint32_t)tokens[i];
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
  }
  return h ^ (h >> 32);
#endif
}

static inline int32_t kva__prefix_find(const kva_cache *c, int32_t parent, uint64_t parent_gen, uint64_t salt,
                                       const int32_t *tokens) {
  uint64_t h = kva__prefix_hash(parent, parent_gen, salt, tokens, c->bs);
  int32_t b;
  for (b = c->buckets[h & c->bucket_mask]; b >= 0; b = c->blk[b].hnext) {
    const kva__block *k = &c->blk[b];
    if (k->hash == h && k->parent == parent && k->parent_gen == parent_gen && k->salt == salt &&
        memcmp(c->blk_tokens + (size_t)b * (size_t)c->bs, tokens, (size_t)c->bs * sizeof(int32_t)) == 0)
      return b;
  }
  return -1;
}

/* --- WINDOW / CHUNK groups' pools (kva__span) --- */

static inline int32_t kva__span_hole(const kva__span *sp) { return sp->n_blocks; }
/* held by a publication only: the group may take it back */
static inline int kva__span_spare(const kva__span *sp, int32_t b) { return sp->ref[b] == 1 && sp->owner[b] >= 0; }
/* held by one sequence and nothing else but perhaps a publication: dropping it frees or spares it */
static inline int kva__span_alone(const kva__span *sp, int32_t b) {
  return b != kva__span_hole(sp) && sp->ref[b] - (sp->owner[b] >= 0) == 1;
}
static inline void kva__span_hold(kva__span *sp, int32_t b) {
  sp->n_spare -= kva__span_spare(sp, b);
  sp->ref[b]++;
  sp->n_spare += kva__span_spare(sp, b);
}
static inline void kva__span_drop(kva__span *sp, int32_t b) {
  KVATTN_ASSERT(b != kva__span_hole(sp) && sp->ref[b] > 0);
  sp->n_spare -= kva__span_spare(sp, b);
  if (--sp->ref[b] == 0) sp->free[sp->n_free++] = b;
  else sp->n_spare += kva__span_spare(sp, b);
}
/* Main-pool block mb is published: its group blocks stay for prefix hits. */
static inline void kva__span_publish(kva__span *sp, int32_t mb, int32_t b) {
  if (b == kva__span_hole(sp)) return;
  sp->pub_block[mb] = b;
  sp->n_spare -= kva__span_spare(sp, b);
  sp->owner[b] = mb;
  sp->ref[b]++;
  sp->n_spare += kva__span_spare(sp, b);
}
static inline void kva__span_unpublish(kva__span *sp, int32_t mb) {
  int32_t b = sp->pub_block[mb];
  if (b < 0) return;
  sp->pub_block[mb] = -1;
  sp->n_spare -= kva__span_spare(sp, b);
  sp->owner[b] = -1; /* no longer spare, whatever holds it */
  if (--sp->ref[b] == 0) sp->free[sp->n_free++] = b;
}
/* A free block, else one only a publication holds (that prefix hit gets shorter). */
static inline int32_t kva__span_take(kva__span *sp) {
  int32_t b;
  if (sp->n_free == 0) {
    KVATTN_ASSERT(sp->n_spare > 0);
    for (b = 0; !kva__span_spare(sp, b); b++) {
    }
    kva__span_unpublish(sp, sp->owner[b]);
  }
  b = sp->free[--sp->n_free];
  sp->ref[b] = 1;
  return b;
}
static inline long kva__span_avail(const kva__span *sp) { return (long)sp->n_free + sp->n_spare; }

/* --- the prefix tier's records (kva_cache_desc.spill / fetch) ---
   One published block, self-describing, in the writer's byte order (as
   sequence streams; a reader of the other order refuses it):
     0    8  magic "kvattnPB"         8  u32 version       12 u32 0x01020304
     16   u64 record bytes            24 its key [32]      56 its parent's key [32]
     88   u64 salt                    96 i32 kind, n_layers, n_kv_heads, head_dim, v_dim, block_size, rotate
     124  u32 0
     128  per layer: u32 K and V types, f32 FP8 scales of K, then V, per KV head
          i32 token ids [block_size]
          per layer: K rows [n_kv_heads][block_size] as stored, then V rows
          u64 checksum of every byte before it (kva__stream_checksum) */
static inline uint64_t kva__stream_checksum(const void *p, size_t n);
static inline void kva__tier_put_i32(unsigned char *p, int32_t v) { memcpy(p, &v, 4); }
static inline int32_t kva__tier_get_i32(const unsigned char *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}
/* The shape fields of a record of this cache, in order */
static inline void kva__tier_shape(const kva_cache *c, int32_t shape[7]) {
  shape[0] = (int32_t)c->kind, shape[1] = c->n_layers, shape[2] = c->G, shape[3] = c->D, shape[4] = c->DV;
  shape[5] = c->bs, shape[6] = c->rotate;
}
static inline void kva__tier_encode(const kva_cache *c, int32_t b, unsigned char *rec) {
  const kva__block *k = &c->blk[b];
  const size_t G = (size_t)c->G, bs = (size_t)c->bs;
  unsigned char *p = rec;
  int32_t shape[7];
  uint64_t u64 = (uint64_t)c->tier_bytes;
  int l, i;
  memcpy(p, KVA__TIER_MAGIC, 8);
  kva__tier_put_i32(p + 8, (int32_t)KVA__TIER_VERSION);
  kva__tier_put_i32(p + 12, (int32_t)0x01020304);
  memcpy(p + 16, &u64, 8);
  memcpy(p + 24, k->key, 32);
  if (k->parent >= 0) memcpy(p + 56, c->blk[k->parent].key, 32);
  else memset(p + 56, 0, 32);
  memcpy(p + 88, &k->salt, 8);
  kva__tier_shape(c, shape);
  for (i = 0; i < 7; i++) kva__tier_put_i32(p + 96 + 4 * i, shape[i]);
  memset(p + 124, 0, 4);
  p += KVA__TIER_HEADER;
  for (l = 0; l < c->n_layers; l++) {
    kva__tier_put_i32(p, (int32_t)c->kt[l]);
    kva__tier_put_i32(p + 4, (int32_t)c->vt[l]);
    memcpy(p + 8, c->k_fp8 + (size_t)l * G, 4 * G);
    memcpy(p + 8 + 4 * G, c->v_fp8 + (size_t)l * G, 4 * G);
    p += 8 + 8 * G;
  }
  memcpy(p, c->blk_tokens + (size_t)b * bs, 4 * bs);
  p += 4 * bs;
  for (l = 0; l < c->n_layers; l++) {
    const unsigned char *blk = c->pool[l] + (size_t)b * c->layer_block[l];
    memcpy(p, blk, G * bs * c->k_row[l]);
    p += G * bs * c->k_row[l];
    memcpy(p, blk + c->v_off[l], G * bs * c->v_row[l]);
    p += G * bs * c->v_row[l];
  }
  u64 = kva__stream_checksum(rec, (size_t)(p - rec));
  memcpy(p, &u64, 8);
}
/* Is rec (size bytes, from outside) a record of this cache for the block
   (key, parent's key, salt, token ids) that was asked for? Every field is
   checked before any byte of it is used. */
static inline int kva__tier_record_ok(const kva_cache *c, const unsigned char *rec, size_t size, const uint8_t key[32],
                                      const uint8_t parent_key[32], uint64_t salt, const int32_t *tok) {
  const size_t G = (size_t)c->G;
  const unsigned char *p;
  int32_t shape[7];
  uint64_t u64;
  int l, i;
  if (size != c->tier_bytes) return 0;
  memcpy(&u64, rec + size - 8, 8);
  if (u64 != kva__stream_checksum(rec, size - 8)) return 0;
  if (memcmp(rec, KVA__TIER_MAGIC, 8) != 0 || kva__tier_get_i32(rec + 8) != (int32_t)KVA__TIER_VERSION ||
      kva__tier_get_i32(rec + 12) != (int32_t)0x01020304)
    return 0;
  memcpy(&u64, rec + 16, 8);
  if (u64 != (uint64_t)size || memcmp(rec + 24, key, 32) != 0 || memcmp(rec + 56, parent_key, 32) != 0) return 0;
  memcpy(&u64, rec + 88, 8);
  if (u64 != salt || kva__tier_get_i32(rec + 124) != 0) return 0;
  kva__tier_shape(c, shape);
  for (i = 0; i < 7; i++)
    if (kva__tier_get_i32(rec + 96 + 4 * i) != shape[i]) return 0;
  p = rec + KVA__TIER_HEADER;
  for (l = 0; l < c->n_layers; l++) { /* the same types and the same FP8 scales, bit for bit */
    if (kva__tier_get_i32(p) != (int32_t)c->kt[l] || kva__tier_get_i32(p + 4) != (int32_t)c->vt[l] ||
        memcmp(p + 8, c->k_fp8 + (size_t)l * G, 4 * G) != 0 || memcmp(p + 8 + 4 * G, c->v_fp8 + (size_t)l * G, 4 * G) != 0)
      return 0;
    p += 8 + 8 * G;
  }
  return memcmp(p, tok, 4 * (size_t)c->bs) == 0;
}
/* A verified record's rows into block b, the block_index-th of its prefix
   (its slots' positions), scores 0, bounds from the rows. */
static inline void kva__tier_decode(kva_cache *c, int32_t b, const unsigned char *rec, int block_index) {
  const size_t G = (size_t)c->G, bs = (size_t)c->bs;
  const unsigned char *p = rec + KVA__TIER_HEADER + (size_t)c->n_layers * (8 + 8 * G) + 4 * bs;
  int l, g, slot;
  for (l = 0; l < c->n_layers; l++) {
    unsigned char *blk = c->pool[l] + (size_t)b * c->layer_block[l];
    memcpy(blk, p, G * bs * c->k_row[l]);
    p += G * bs * c->k_row[l];
    memcpy(blk + c->v_off[l], p, G * bs * c->v_row[l]);
    p += G * bs * c->v_row[l];
    for (g = 0; g < c->G; g++) {
      if (c->block_bounds) kva__bounds_reset(c, l, b, g);
      for (slot = 0; slot < c->bs; slot++) {
        if (c->block_pos) *kva__pos_ptr(c, l, b, g, slot) = (int32_t)((long)block_index * c->bs + slot);
        if (c->block_score) *kva__score_ptr(c, l, b, g, slot) = 0.0f;
        if (c->block_bounds) kva__bounds_add(c, l, b, g, slot);
      }
    }
  }
}
/* A published block leaves memory: hand its record to the tier */
static inline void kva__tier_spill(kva_cache *c, int32_t b) {
  if (!c->spill || c->tier_quiet) return;
  kva__tier_encode(c, b, c->tier_out);
  c->tier_spills++;
  if (c->spill(c->tier_user, c->blk[b].key, c->tier_out, c->tier_bytes) != KVA_OK) c->tier_spill_errors++;
}

/* --- unpublishing: a block leaves the prefix table (and every group's pool
   forgets it); the block pool and prefix caching below call it --- */

static inline void kva__unpublish_one(kva_cache *c, int32_t b) {
  kva__block *k = &c->blk[b];
  int32_t *link = &c->buckets[k->hash & c->bucket_mask];
  int i;
  kva__tier_spill(c, b); /* (its parent is still published: children leave first) */
  for (i = 0; i < c->n_spans; i++) kva__span_unpublish(&c->spans[i], b);
  KVATTN_ASSERT(k->first_child < 0);
  while (*link != b) link = &c->blk[*link].hnext;
  *link = k->hnext;
  if (k->parent >= 0) { /* leave the parent's list of children */
    if (k->prev_sib >= 0) c->blk[k->prev_sib].next_sib = k->next_sib;
    else c->blk[k->parent].first_child = k->next_sib;
    if (k->next_sib >= 0) c->blk[k->next_sib].prev_sib = k->prev_sib;
  }
  k->published = 0;
  if (k->ref == 0) { /* cached -> free */
    kva__list_remove(c, b);
    c->n_cached--;
    kva__list_push_back(c, KVA__FREE_LIST(c), b);
    c->n_free++;
  }
}

/* Forget a published block and everything published under it: children
   name their parent by publication, so without it they are unreachable. */
static inline void kva__unpublish(kva_cache *c, int32_t b) {
  int32_t *stack = c->victims; /* n_blocks * bs >= published blocks */
  int top = 0;
  stack[top++] = b;
  while (top > 0) {
    int32_t x = stack[top - 1];
    if (c->blk[x].first_child >= 0) {
      stack[top++] = c->blk[x].first_child;
      continue;
    }
    top--;
    kva__unpublish_one(c, x);
    if (x != b) c->prefix_forgotten++;
  }
}

/* --- block pool --- */

/* Take a block: a free one, else the least recently used cached one. */
static inline int32_t kva__block_take(kva_cache *c) {
  int32_t b;
  if (c->n_free == 0) {
    KVATTN_ASSERT(c->n_cached > 0);
    kva__unpublish(c, c->blk[KVA__CACHED_LIST(c)].next);
    c->prefix_forgotten++;
  }
  b = c->blk[KVA__FREE_LIST(c)].next;
  kva__list_remove(c, b);
  c->n_free--;
  c->blk[b].ref = 1;
  c->n_used++;
  return b;
}

static inline void kva__block_ref(kva_cache *c, int32_t b) {
  if (c->blk[b].ref++ == 0) { /* a cached block comes back into use */
    kva__list_remove(c, b);
    c->n_cached--;
    c->n_used++;
  }
}

static inline void kva__block_release(kva_cache *c, int32_t b) {
  KVATTN_ASSERT(c->blk[b].ref > 0);
  if (--c->blk[b].ref > 0) return;
  c->n_used--;
  c->blk[b].last_use = c->append_counter;
  if (c->blk[b].published) {
    kva__list_push_back(c, KVA__CACHED_LIST(c), b);
    c->n_cached++;
  } else {
    kva__list_push_back(c, KVA__FREE_LIST(c), b);
    c->n_free++;
  }
}

/* The block an append of this sequence would write into must be copied
   first if another sequence or the prefix cache can see it. */
static inline int kva__tail_needs_copy(const kva_cache *c, const kva__seq *s) {
  int32_t b;
  if (s->len % c->bs == 0 || s->n_blocks * c->bs <= s->len) return 0;
  b = s->table[s->len / c->bs];
  return c->blk[b].ref > 1 || c->blk[b].published;
}

static inline void kva__copy_block(kva_cache *c, int32_t dst, int32_t src) {
  int l;
  for (l = 0; l < c->n_layers; l++) {
    size_t pos_block = (size_t)c->G * (size_t)c->bs;
    if (c->layer_span[l] >= 0) continue; /* the main pool's layers only */
    memcpy(c->pool[l] + (size_t)dst * c->layer_block[l], c->pool[l] + (size_t)src * c->layer_block[l],
           c->layer_block[l]);
    if (c->block_pos)
      memcpy(kva__pos_ptr(c, l, dst, 0, 0), kva__pos_ptr(c, l, src, 0, 0), pos_block * sizeof(int32_t));
    if (c->block_score)
      memcpy(kva__score_ptr(c, l, dst, 0, 0), kva__score_ptr(c, l, src, 0, 0), pos_block * sizeof(float));
    if (c->block_bounds)
      memcpy(kva__bounds_ptr(c, l, dst, 0), kva__bounds_ptr(c, l, src, 0), (size_t)c->G * 2 * (size_t)c->D * sizeof(uint16_t));
  }
}

/* Give sequence s its own copy of its i-th block (the pool has one to spare). */
static inline void kva__copy_on_write(kva_cache *c, kva__seq *s, int i) {
  int32_t old = s->table[i], b = kva__block_take(c);
  kva__copy_block(c, b, old);
  kva__block_release(c, old);
  s->table[i] = b;
  c->cow_copies++;
}

/* --- a sequence's blocks in the groups' pools: copy on write, what a
   position still sees, release --- */

/* Sequence s's i-th block of span w, made its own (the group has one to spare). */
static inline void kva__span_copy_on_write(kva_cache *c, kva__seq *s, int w, int i) {
  kva__span *sp = &c->spans[w];
  int32_t *t = kva__span_table(c, s, w), old = t[i], b = kva__span_take(sp);
  int l;
  for (l = 0; l < c->n_layers; l++)
    if (c->layer_span[l] == w) {
      memcpy(c->pool[l] + (size_t)b * c->layer_block[l], c->pool[l] + (size_t)old * c->layer_block[l],
             c->layer_block[l]);
      if (c->block_bounds)
        memcpy(kva__bounds_ptr(c, l, b, 0), kva__bounds_ptr(c, l, old, 0),
               (size_t)c->G * 2 * (size_t)c->D * sizeof(uint16_t));
    }
  kva__span_drop(sp, old);
  t[i] = b;
}

/* The first block of span w that a query at position p, or later, can see
   (the sinks aside); before it, a sequence's blocks there are released. */
static inline int kva__span_first_block(const kva_cache *c, const kva__span *sp, long p) {
  long first = sp->kind == KVA_SPAN_WINDOW ? p - sp->window + 1 : p / sp->chunk * sp->chunk;
  return first > 0 ? (int)(first / c->bs) : 0;
}
static inline int kva__span_sink_blocks(const kva_cache *c, const kva__span *sp) {
  return sp->kind == KVA_SPAN_WINDOW ? kva__blocks_for(c, sp->n_sink) : 0;
}
/* Does s still hold, in every group, what queries at positions >= p see?
   (A sequence's released blocks are [sink blocks, span_from).) */
static inline int kva__spans_hold(const kva_cache *c, const kva__seq *s, long p) {
  int w;
  for (w = 0; w < c->n_spans; w++) {
    const kva__span *sp = &c->spans[w];
    int first = kva__span_first_block(c, sp, p), sinks = kva__span_sink_blocks(c, sp);
    if ((first > sinks ? first : sinks) < s->span_from[w]) return 0;
  }
  return 1;
}
/* Release s's blocks of span w that no query at position p or later can see. */
static inline void kva__span_release_before(kva_cache *c, kva__seq *s, int w, long p) {
  kva__span *sp = &c->spans[w];
  int32_t *t = kva__span_table(c, s, w);
  int to = kva__span_first_block(c, sp, p), i;
  if (to > s->n_blocks) to = s->n_blocks;
  for (i = s->span_from[w]; i < to; i++) {
    if (t[i] != kva__span_hole(sp)) kva__span_drop(sp, t[i]);
    t[i] = kva__span_hole(sp);
  }
  if (to > s->span_from[w]) s->span_from[w] = to;
}
/* Drop s's group blocks from index `from` on (truncation, free). */
static inline void kva__spans_drop_from(kva_cache *c, kva__seq *s, int from) {
  int w, i;
  for (w = 0; w < c->n_spans; w++) {
    kva__span *sp = &c->spans[w];
    int32_t *t = kva__span_table(c, s, w);
    int sinks = kva__span_sink_blocks(c, sp);
    for (i = from; i < s->n_blocks; i++)
      if (t[i] != kva__span_hole(sp)) kva__span_drop(sp, t[i]);
    if (s->span_from[w] > from) s->span_from[w] = from > sinks ? from : sinks;
  }
}

/* --- prefix expiry (kva_cache_desc.prefix_max_age) --- */

/* Forget cached blocks unused for prefix_max_age appends (LRU order = age order). */
static inline void kva__prefix_expire(kva_cache *c) {
  while (c->prefix_max_age > 0 && c->n_cached > 0) {
    int32_t b = c->blk[KVA__CACHED_LIST(c)].next;
    if (c->append_counter - c->blk[b].last_use < c->prefix_max_age) break;
    kva__unpublish(c, b);
    c->prefix_forgotten++;
  }
}

/* --- the demoted region (kva_evict.demote_dtype) ---
   Tokens an eviction removes move, converted to the demoted type, into a
   ring of dm_cap slots in the demoted pool; once it is full each one takes
   the place of the token demoted longest ago. Slots hold tokens in no
   particular order (attention reads positions beside them), so the ring
   never moves a row. */
/* Does policy e give layers or heads budgets of their own (kva_evict.layer_weight, share_heads)? */
static inline int kva__uneven(const kva_evict *e) { return e->layer_weight != NULL || e->share_heads; }
/* Tokens each KV head of layer l keeps under e (with share_heads: on average over the layer's heads) */
static inline long kva__layer_budget(const kva_evict *e, int l) {
  double b;
  if (!e->layer_weight) return e->budget;
  b = floor((double)e->budget * (double)e->layer_weight[l]);
  return b >= (double)INT_MAX ? INT_MAX : (long)b;
}

static inline int kva__demotes(const kva_evict *e) {
  return e->kind != KVA_EVICT_NONE && e->demote_dtype != KVA_DTYPE_DEFAULT;
}
/* The ring's size under policy e: demote_budget, or what a block table holds */
static inline int kva__demote_cap(const kva_cache *c, const kva_evict *e) {
  long most = (long)c->dm_max_table * c->bs;
  return e->demote_budget > 0 && e->demote_budget < most ? e->demote_budget : (int)most;
}
/* Tokens the region holds after n more are demoted under e */
static inline int kva__demoted_after(const kva_cache *c, const kva__seq *s, const kva_evict *e, long n) {
  long cap = kva__demote_cap(c, e), after = (long)s->dm_len + n;
  return (int)(after < cap ? after : cap);
}
static inline unsigned char *kva__dm_k_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->dm_pool + ((size_t)l * (size_t)c->dm_blocks + (size_t)b) * c->dm_block +
         ((size_t)g * (size_t)c->bs + (size_t)slot) * c->dm_k_row;
}
static inline unsigned char *kva__dm_v_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->dm_pool + ((size_t)l * (size_t)c->dm_blocks + (size_t)b) * c->dm_block + c->dm_v_off +
         ((size_t)g * (size_t)c->bs + (size_t)slot) * c->dm_v_row;
}
static inline int32_t *kva__dm_pos_ptr(const kva_cache *c, int l, int32_t b, int g, int slot) {
  return c->dm_pos + (((size_t)l * (size_t)c->dm_blocks + (size_t)b) * (size_t)c->G + (size_t)g) * (size_t)c->bs +
         (size_t)slot;
}
/* Victims [0, count) of head (l, g), in the order they go, into the ring
   from s->dm_next on (the caller advances it once every head is done). Of
   more victims than the ring holds only the last dm_cap would stay. */
static inline void kva__demote_victims(kva_cache *c, const kva__seq *s, int l, int g, const int32_t *victims,
                                       int count) {
  const size_t at = (size_t)l * (size_t)c->G + (size_t)g;
  int k = count > s->dm_cap ? count - s->dm_cap : 0;
  for (; k < count; k++) {
    int r = (int)(((long)s->dm_next + k) % s->dm_cap), ri = r % c->bs, vi;
    int32_t rb = s->dm_table[r / c->bs], vb = kva__slot_block(c, s, l, victims[k], &vi);
    kva__load_row(c->kt[l], c->dm_row, kva__k_ptr(c, l, vb, g, vi), c->D, c->k_fp8[at]);
    kva__store_row(c->dt, kva__dm_k_ptr(c, l, rb, g, ri), c->dm_row, c->D, 1.0f);
    kva__load_row(c->vt[l], c->dm_row, kva__v_ptr(c, l, vb, g, vi), c->DV, c->v_fp8[at]);
    kva__store_row(c->dt, kva__dm_v_ptr(c, l, rb, g, ri), c->dm_row, c->DV, 1.0f);
    *kva__dm_pos_ptr(c, l, rb, g, ri) = *kva__pos_ptr(c, l, vb, g, vi);
  }
}
/* Make room in the ring for `count` demoted tokens under e (blocks planned free) */
static inline void kva__demote_begin(kva_cache *c, kva__seq *s, const kva_evict *e, int count) {
  int after = kva__demoted_after(c, s, e, count);
  if (s->dm_len == 0) s->dm_next = 0, s->dm_cap = kva__demote_cap(c, e);
  while (s->dm_n_blocks < kva__blocks_for(c, after)) s->dm_table[s->dm_n_blocks++] = c->dm_free[--c->dm_n_free];
}
static inline void kva__demote_end(kva__seq *s, int count) {
  s->dm_next = (int)(((long)s->dm_next + count) % s->dm_cap);
  s->dm_len = (long)s->dm_len + count < s->dm_cap ? s->dm_len + count : s->dm_cap;
}
static inline void kva__demoted_release(kva_cache *c, kva__seq *s) {
  while (s->dm_n_blocks > 0) c->dm_free[c->dm_n_free++] = s->dm_table[--s->dm_n_blocks];
  s->dm_len = s->dm_next = s->dm_cap = 0;
}

/* --- sequences --- */

/* The record of a live sequence id, or NULL. */
static inline kva__seq *kva__seq_get(const kva_cache *c, int seq) {
  kva__seq *s;
  if (!c || seq < 0) return NULL;
  s = &c->seqs[seq % c->max_seqs];
  return s->live && s->gen == seq / c->max_seqs ? s : NULL;
}

/* The first slot of the step that some layer has not stored (INT_MAX: none). */
static inline int kva__step_unstored(const kva_cache *c, const kva__seq *s) {
  int l, first = INT_MAX, step_start = s->len - s->last_append;
  for (l = 0; l < c->n_layers; l++) {
    const int32_t *done = s->stored + 2 * l; /* one range [from, to) of the step */
    int unstored = done[0] > 0 ? 0 : done[1]; /* the step's first unstored token */
    if (unstored < s->last_append && step_start + unstored < first) first = step_start + unstored;
  }
  return first;
}

/* The first slot some layer has not stored, in any step (INT_MAX: none). */
static inline int kva__first_unstored(const kva_cache *c, const kva__seq *s) {
  int unstored = kva__step_unstored(c, s);
  return s->unstored_from < unstored ? s->unstored_from : unstored;
}

/* End the sequence's step (remembering what it left unstored) and begin one
   of n_new tokens (0: none, until the next append). */
static inline void kva__step_begin(kva_cache *c, kva__seq *s, int n_new) {
  int unstored = kva__step_unstored(c, s);
  if (unstored < s->unstored_from) s->unstored_from = unstored;
  s->last_append = n_new;
  memset(s->stored, 0, (size_t)c->n_layers * 2 * sizeof(int32_t));
}

/* Has `layer` stored every token of the sequence's step? */
static inline int kva__step_stored(const kva__seq *s, int layer) {
  return s->stored[2 * layer] == 0 && s->stored[2 * layer + 1] == s->last_append;
}

/* A free sequence record, or NULL (max_seqs live). */
static inline kva__seq *kva__seq_alloc(kva_cache *c, int *seq) {
  int i, j, gen_limit = INT_MAX / c->max_seqs; /* a slot out of generations is retired: ids never repeat */
  for (i = 0; i < c->max_seqs; i++) {
    kva__seq *s = &c->seqs[i];
    if (s->live || s->gen >= gen_limit) continue;
    s->live = 1;
    s->len = s->pos = s->n_blocks = s->last_append = 0;
    s->dm_n_blocks = s->dm_len = s->dm_next = s->dm_cap = 0;
    s->n_empty = 0;
    s->unstored_from = INT_MAX;
    memset(s->stored, 0, (size_t)c->n_layers * 2 * sizeof(int32_t));
    memset(&s->evict, 0, sizeof s->evict); /* not the policy of the id this record held before */
    memset(&s->evict_next, 0, sizeof s->evict_next);
    for (j = 0; j < c->n_spans; j++) s->span_from[j] = kva__span_sink_blocks(c, &c->spans[j]);
    c->n_live++;
    *seq = s->gen * c->max_seqs + i;
    return s;
  }
  return NULL;
}

KVA_API kva_status kva_seq_new(kva_cache *c, int *seq) {
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !seq, KVA_ERR_ARG);
  if (!kva__seq_alloc(c, seq)) return kva__refuse(c, KVA_ERR_SEQ_LIMIT, __func__, "max_seqs sequences are live");
  return KVA_OK;
}

KVA_API kva_status kva_seq_free(kva_cache *c, int seq) {
  kva__seq *s;
  int i;
  KVA__REFUSE(c, !c, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  kva__spans_drop_from(c, s, 0);
  for (i = s->n_blocks - 1; i >= 0; i--) kva__block_release(c, s->table[i]); /* tail first: LRU drops tails first */
  kva__demoted_release(c, s);
  s->live = 0;
  s->gen++;
  s->len = s->pos = s->n_blocks = s->last_append = 0;
  c->n_live--;
  return KVA_OK;
}

KVA_API int kva_seq_len(const kva_cache *c, int seq) {
  const kva__seq *s = kva__seq_get(c, seq);
  return s ? s->len : -1;
}

KVA_API int kva_seq_pos(const kva_cache *c, int seq) {
  const kva__seq *s = kva__seq_get(c, seq);
  return s ? s->pos : -1;
}

/* --- eviction (planned first, applied only if the whole append fits) --- */

static inline int kva__block_shared(const kva_cache *c, int32_t b) { return c->blk[b].ref > 1 || c->blk[b].published; }

/* Does attention under policy e add to the tokens' scores (H2O's, or a scorer's attn_sum)? */
static inline int kva__accumulates(const kva_evict *e) {
  return e->kind == KVA_EVICT_H2O || (e->kind == KVA_EVICT_SCORE && e->accumulate);
}

/* Is the token in this slot of head (l, g) evictable under policy e? */
static inline int kva__evictable(const kva_cache *c, const kva__seq *s, const kva_evict *e, int l, int g, int slot) {
  int in_block;
  int32_t b = kva__slot_block(c, s, l, slot, &in_block), p = *kva__pos_ptr(c, l, b, g, in_block);
  if (p < e->n_sink || p == KVA_POS_EMPTY) return 0;
  return e->kind == KVA_EVICT_WINDOW || (long)p < (long)s->pos - e->n_recent;
}

/* Tokens an append of n may evict: the fewest evictable over all heads. */
static inline int kva__evict_count(const kva_cache *c, const kva__seq *s, const kva_evict *e, int n) {
  int l, g, slot, want, least = INT_MAX;
  if (e->rollback) n = 0; /* the new step's tokens wait for the next append */
  if (e->kind == KVA_EVICT_NONE || (long)s->len + n <= e->budget) return 0;
  want = (int)((long)s->len + n - e->budget);
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++) {
      int k = 0;
      for (slot = 0; slot < s->len && k < want; slot++) k += kva__evictable(c, s, e, l, g, slot);
      if (k < least) least = k;
    }
  return want < least ? want : least;
}

/* Victim order: H2O lowest score first, then oldest; WINDOW oldest first. */
static inline int kva__victim_before(const kva_cache *c, const kva__seq *s, const kva_evict *e, int l, int g, int a,
                                     int b) {
  int ia, ib;
  int32_t ba = kva__slot_block(c, s, l, a, &ia), bb = kva__slot_block(c, s, l, b, &ib);
  if (e->kind == KVA_EVICT_H2O) {
    float sa = *kva__score_ptr(c, l, ba, g, ia), sb = *kva__score_ptr(c, l, bb, g, ib);
    if (sa != sb) return sa < sb;
  }
  return *kva__pos_ptr(c, l, ba, g, ia) < *kva__pos_ptr(c, l, bb, g, ib);
}

/* Evict `count` tokens from every head, filling the holes below the new
   length with the survivors above it; blocks below it are private. With
   demotion they go to the demoted region first. */
static inline void kva__evict_apply(kva_cache *c, kva__seq *s, const kva_evict *e, int count, const int32_t *chosen) {
  int l, g, k, slot, new_len = s->len - count;
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++) {
      int nv = 0, src = new_len;
      if (chosen) { /* a scorer's ranking (kva__score_victims) */
        for (; nv < count; nv++) {
          c->victims[nv] = chosen[((size_t)l * (size_t)c->G + (size_t)g) * (size_t)count + (size_t)nv];
          c->victim_flag[c->victims[nv]] = 1;
        }
      }
      /* else pick victims one by one: count is small on decode steps; a chunk's selection is O(count * len) */
      for (k = nv; k < count; k++) {
        int best = -1;
        for (slot = 0; slot < s->len; slot++)
          if (!c->victim_flag[slot] && kva__evictable(c, s, e, l, g, slot) &&
              (best < 0 || kva__victim_before(c, s, e, l, g, slot, best)))
            best = slot;
        KVATTN_ASSERT(best >= 0);
        c->victim_flag[best] = 1;
        c->victims[nv++] = best;
      }
      if (kva__demotes(e)) kva__demote_victims(c, s, l, g, c->victims, nv);
      for (k = 0; k < nv; k++) {
        int hole = c->victims[k], hi, si;
        int32_t hb, sb;
        if (hole >= new_len) continue;
        while (c->victim_flag[src]) src++;
        hb = kva__slot_block(c, s, l, hole, &hi);
        sb = kva__slot_block(c, s, l, src, &si);
        kva__slot_move(c, l, g, hb, hi, sb, si);
        src++;
      }
      for (k = 0; k < nv; k++) c->victim_flag[c->victims[k]] = 0;
    }
}

static inline kva_status kva__evict_check(const kva_evict *e) {
  if (!e || e->rollback < 0 || e->rollback > 1 || e->accumulate < 0 || e->accumulate > 1) return KVA_ERR_ARG;
  if (!kva__dtype_valid(e->demote_dtype) || e->demote_budget < 0 ||
      (e->demote_dtype == KVA_DTYPE_DEFAULT && e->demote_budget != 0))
    return KVA_ERR_ARG;
  if (e->kind != KVA_EVICT_SCORE && (e->score || e->accumulate)) return KVA_ERR_ARG;
  if (e->kind != KVA_EVICT_NONE &&
      (e->share_heads < 0 || e->share_heads > 1 || (kva__uneven(e) && e->kind != KVA_EVICT_SCORE)))
    return KVA_ERR_ARG;
  switch (e->kind) {
    case KVA_EVICT_NONE: return KVA_OK;
    case KVA_EVICT_WINDOW:
      return e->budget <= 0 || e->n_sink < 0 || e->n_sink > e->budget ? KVA_ERR_ARG : KVA_OK;
    case KVA_EVICT_SCORE:
      if (!e->score) return KVA_ERR_ARG;
      /* fall through */
    case KVA_EVICT_H2O:
      return e->budget <= 0 || e->n_sink < 0 || e->n_recent < 0 || (long)e->n_sink + e->n_recent > e->budget
                 ? KVA_ERR_ARG
                 : KVA_OK;
  }
  return KVA_ERR_ARG;
}

/* What an append of n tokens would do: evict, copy shared blocks that
   eviction compacts or H2O scores (all kept blocks, a slight over-copy),
   release emptied blocks, copy a shared partial tail, take new blocks. */
typedef struct {
  int n_evict;  /* slots the sequence loses (per-layer / per-head budgets: len - the most any head keeps) */
  int evicts;   /* some head evicts (and every head is compacted) */
  int keep_blocks, private_to, fits_now, fits_table; /* fits_table: the block table's limit */
  long copies, fresh, releasable;
  long span_need[KVA_MAX_GROUPS], span_releasable[KVA_MAX_GROUPS]; /* each WINDOW / CHUNK group's */
  int dm_take;  /* demoted blocks it takes */
} kva__append_plan;

static inline int kva__uneven_len(const kva_cache *c, const kva__seq *s, const kva_evict *e, int n, int *evicts);

/* The plan once the sequence keeps new_len slots (evicts: some head evicts) */
static inline void kva__plan_shrink(const kva_cache *c, const kva__seq *s, int n, const kva_evict *e, int new_len,
                                    int evicts, kva__append_plan *pl) {
  int i, w;
  long avail = (long)c->n_free + c->n_cached;
  pl->n_evict = s->len - new_len;
  pl->evicts = evicts;
  pl->keep_blocks = kva__blocks_for(c, new_len);
  pl->private_to = kva__accumulates(e) || evicts ? pl->keep_blocks : 0;
  pl->copies = pl->releasable = 0;
  for (i = 0; i < pl->private_to; i++) pl->copies += kva__block_shared(c, s->table[i]);
  for (i = pl->keep_blocks; i < s->n_blocks; i++) pl->releasable += c->blk[s->table[i]].ref == 1;
  pl->fresh = kva__blocks_for(c, (long)new_len + n) - pl->keep_blocks;
  if (new_len % c->bs && new_len / c->bs >= pl->private_to && kva__block_shared(c, s->table[new_len / c->bs]))
    pl->fresh++;
  /* copies are taken before emptied blocks return to the pool */
  pl->fits_table = kva__blocks_for(c, (long)new_len + n) <= c->max_table;
  pl->fits_now = pl->copies <= avail && pl->copies + pl->fresh <= avail + pl->releasable && pl->fits_table;
  pl->dm_take = kva__demotes(e) && evicts
                    ? kva__blocks_for(c, kva__demoted_after(c, s, e, pl->n_evict)) - s->dm_n_blocks
                    : 0;
  if (pl->dm_take > c->dm_n_free) pl->fits_now = 0;
  /* a group releases what the step's queries cannot see, copies a shared tail, takes new blocks
     (its sequences do not evict: new_len is s->len) */
  for (w = 0; w < c->n_spans; w++) {
    const kva__span *sp = &c->spans[w];
    const int32_t *t = kva__span_table(c, s, w);
    int to = kva__span_first_block(c, sp, s->len);
    if (to > s->n_blocks) to = s->n_blocks;
    pl->span_releasable[w] = 0;
    for (i = s->span_from[w]; i < to; i++) pl->span_releasable[w] += kva__span_alone(sp, t[i]);
    pl->span_need[w] = kva__blocks_for(c, (long)s->len + n) - s->n_blocks;
    if (s->len % c->bs && s->len / c->bs < s->n_blocks && sp->ref[t[s->len / c->bs]] > 1) pl->span_need[w]++;
    if (pl->span_need[w] > kva__span_avail(sp) + pl->span_releasable[w]) pl->fits_now = 0;
  }
}

static inline void kva__plan_append(const kva_cache *c, const kva__seq *s, int n, const kva_evict *e,
                                    kva__append_plan *pl) {
  int evicts, new_len;
  if (kva__uneven(e)) {
    new_len = kva__uneven_len(c, s, e, n, &evicts);
  } else {
    int count = kva__evict_count(c, s, e, n);
    new_len = s->len - count, evicts = count > 0;
  }
  kva__plan_shrink(c, s, n, e, new_len, evicts, pl);
}

/* --- eviction by a scorer (KVA_EVICT_SCORE) ---
   The scorer sees one layer and KV head at a time, on a copy of the held
   rows read back as kva_seq_read gives them; its scores rank that head's
   evictable slots (lowest first, then oldest), and the first `count` of
   each head go. All of it happens before anything changes, so a refusal
   (a NaN, an error status, no memory) leaves the sequence as it was. */
typedef struct {
  int32_t *victims; /* [n_layers][G][count] slots; per-layer / per-head budgets: [n_layers][G][len] */
  int32_t *count;   /* per-layer / per-head budgets: [n_layers][G] each head's victims; else NULL */
  int new_len;      /* per-layer / per-head budgets: the most tokens any head keeps */
  void *work;       /* the scorer's rows and the ranking */
  size_t bytes;
} kva__scored;

static inline void kva__rotate_row(float *x, int n);
/* One head's stored K and V rows (either output may be NULL), dequantized
   and back in the original basis: what kva_seq_read and kva_seq_read_demoted give. */
static inline void kva__read_head(const kva_cache *c, kva_dtype kt, kva_dtype vt, const void *krow, const void *vrow,
                                  float fk, float fv, float *k, float *v) {
  if (k) {
    kva__load_row(kt, k, krow, c->D, fk);
    if (c->rotate & KVA_ROTATE_K) kva__rotate_row(k, c->D);
  }
  if (v) {
    kva__load_row(vt, v, vrow, c->DV, fv);
    if (c->rotate & KVA_ROTATE_V) kva__rotate_row(v, c->DV);
  }
}

static inline const char *kva__score_why(kva_status st) {
  return st == KVA_ERR_NOMEM ? "no memory for the scorer's rows" : "the eviction scorer refused or wrote a NaN score";
}
static inline void kva__scored_free(const kva_cache *c, kva__scored *sc) {
  kva__heap h;
  h.alloc_fn = c->alloc_fn, h.free_fn = c->free_fn, h.user = c->user;
  kva__heap_give(&h, sc->work, sc->bytes);
  sc->work = NULL, sc->victims = NULL, sc->count = NULL, sc->bytes = 0;
}
static inline kva_status kva__uneven_victims(kva_cache *c, const kva__seq *s, int seq, const kva_evict *e, int n,
                                             int count, kva__scored *out);


/* --- per-layer and per-head budgets (kva_evict.layer_weight, share_heads) ---
   Every head keeps its own count: the sequence's slots are the most any
   head keeps, and a head keeping fewer leaves slots empty (KVA_POS_EMPTY:
   zero rows, never attended). An append that makes some head exceed its
   budget evicts in that head and compacts every head, so the empty slots
   sit above each head's kept tokens, below the newest. */

/* Head (l, g)'s tokens held and how many of those policy e may evict */
static inline void kva__head_counts(const kva_cache *c, const kva__seq *s, const kva_evict *e, int l, int g, long *held,
                                    long *evictable) {
  int slot;
  *held = *evictable = 0;
  for (slot = 0; slot < s->len; slot++) {
    int in_block;
    int32_t b = kva__slot_block(c, s, l, slot, &in_block);
    *held += *kva__pos_ptr(c, l, b, g, in_block) != KVA_POS_EMPTY;
    *evictable += kva__evictable(c, s, e, l, g, slot);
  }
}
/* How many tokens a head or a layer gives up: what held + the append's
   tokens exceed the budget by, at most what may be evicted */
static inline long kva__excess(long held, long n_in, long budget, long evictable) {
  long over = held + n_in - budget;
  return over <= 0 ? 0 : over < evictable ? over : evictable;
}

/* Before any scorer runs: does an append of n make some head evict, and
   how many slots stay? Exact where each head has its own budget; with
   share_heads the scores decide which heads give, so a layer that evicts
   counts as many slots as its fullest head holds now (an upper bound:
   kva_seq_fits stays on the safe side). */
static inline int kva__uneven_len(const kva_cache *c, const kva__seq *s, const kva_evict *e, int n, int *evicts) {
  const long n_in = e->rollback ? 0 : n;
  long new_len = 0, held, evictable;
  int l, g;
  *evicts = 0;
  for (l = 0; l < c->n_layers; l++) {
    const long budget = kva__layer_budget(e, l);
    long held_sum = 0, evictable_sum = 0, most = 0;
    for (g = 0; g < c->G; g++) {
      kva__head_counts(c, s, e, l, g, &held, &evictable);
      if (e->share_heads) {
        held_sum += held, evictable_sum += evictable;
        if (held > most) most = held;
      } else {
        long gone = kva__excess(held, n_in, budget, evictable);
        *evicts |= gone > 0;
        if (held - gone > new_len) new_len = held - gone;
      }
    }
    if (e->share_heads) {
      *evicts |= kva__excess(held_sum, n_in * c->G, budget * c->G, evictable_sum) > 0;
      if (most > new_len) new_len = most;
    }
  }
  return *evicts ? (int)new_len : s->len;
}

typedef struct {
  float score;
  int32_t pos, slot, head;
} kva__head_ranked;
static int kva__head_ranked_cmp(const void *a, const void *b) { /* lowest score first, then oldest, then head */
  const kva__head_ranked *x = (const kva__head_ranked *)a, *y = (const kva__head_ranked *)b;
  if (x->score != y->score) return x->score < y->score ? -1 : 1;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  return (x->head > y->head) - (x->head < y->head);
}
static int kva__head_ranked_pos_cmp(const void *a, const void *b) {
  const kva__head_ranked *x = (const kva__head_ranked *)a, *y = (const kva__head_ranked *)b;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The scorer sees every head's held tokens (not its empty slots); each
   head gives up what it exceeds its budget by, its lowest scores first, or
   with share_heads each layer gives up what its heads together exceed
   n_kv_heads x its budget by, the lowest scores over all its heads first.
   Nothing changes here: a refusal leaves the sequence as it was. */
static inline kva_status kva__uneven_victims(kva_cache *c, const kva__seq *s, int seq, const kva_evict *e, int n,
                                             int count, kva__scored *out) {
  const size_t len = (size_t)s->len, D = (size_t)c->D, DV = c->kind == KVA_CACHE_KV ? (size_t)c->DV : 0;
  const size_t heads = (size_t)c->n_layers * (size_t)c->G;
  const long n_in = e->rollback ? 0 : n;
  const int attn_known = e->accumulate && kva__accumulates(&s->evict);
  kva__heap h;
  float *k, *v, *scores, *attn;
  int32_t *pos, *held_of;
  kva__head_ranked *order, *ranked;
  int l, g, i;
  h.alloc_fn = c->alloc_fn, h.free_fn = c->free_fn, h.user = c->user;
  out->bytes = len * (D + DV + 3) * sizeof(float) + len * (1 + (size_t)c->G) * sizeof(kva__head_ranked) +
               (heads * len + heads + (size_t)c->G) * sizeof(int32_t);
  out->work = kva__heap_take(&h, out->bytes);
  if (!out->work) return KVA_ERR_NOMEM;
  k = (float *)out->work, v = k + len * D, scores = v + len * DV, attn = scores + len;
  pos = (int32_t *)(attn + len);
  order = (kva__head_ranked *)(pos + len);
  ranked = order + len; /* [G * len] a layer's evictable tokens, every head's */
  out->victims = (int32_t *)(ranked + (size_t)c->G * len);
  out->count = out->victims + heads * len;
  held_of = out->count + heads; /* [G] the layer's heads' tokens held */
  out->new_len = 0;
  for (l = 0; l < c->n_layers; l++) {
    const long budget = kva__layer_budget(e, l);
    long held_sum = 0, gone;
    int m = 0, m0;
    for (g = 0; g < c->G; g++) {
      const float fk = c->k_fp8[(size_t)l * (size_t)c->G + (size_t)g], fv = c->v_fp8[(size_t)l * (size_t)c->G + (size_t)g];
      kva_score_view view;
      kva_status st;
      int held = 0, slot, in_block;
      int32_t b;
      for (slot = 0; slot < s->len; slot++) { /* the held tokens, oldest first */
        b = kva__slot_block(c, s, l, slot, &in_block);
        order[held].pos = *kva__pos_ptr(c, l, b, g, in_block), order[held].slot = slot;
        held += order[held].pos != KVA_POS_EMPTY;
      }
      qsort(order, (size_t)held, sizeof order[0], kva__head_ranked_pos_cmp);
      for (i = 0; i < held; i++) {
        b = kva__slot_block(c, s, l, order[i].slot, &in_block);
        kva__read_head(c, c->kt[l], c->vt[l], kva__k_ptr(c, l, b, g, in_block),
                       DV ? kva__v_ptr(c, l, b, g, in_block) : NULL, fk, fv, k + (size_t)i * D,
                       DV ? v + (size_t)i * DV : NULL);
        pos[i] = order[i].pos;
        attn[i] = attn_known ? *kva__score_ptr(c, l, b, g, in_block) : 0.0f;
        scores[i] = NAN; /* unwritten counts as NaN */
      }
      memset(&view, 0, sizeof view);
      view.seq = seq, view.layer = l, view.kv_head = g;
      view.n_layers = c->n_layers, view.n_kv_heads = c->G;
      view.n = held;
      { /* its own budget's keep; with share_heads an even share (the layer decides); uniform: all but count */
        long keep = count >= 0 ? held - count : budget - n_in;
        keep = keep < 0 ? 0 : keep;
        view.keep = keep < held ? (int)keep : held;
      }
      view.head_dim = c->D, view.v_dim = c->DV;
      view.pos = pos, view.k = k, view.v = DV ? v : NULL, view.attn_sum = e->accumulate ? attn : NULL;
      st = e->score(e->score_user, &view, scores);
      if (st != KVA_OK) {
        kva__scored_free(c, out);
        return st > KVA_OK && st <= KVA_ERR_STEP ? st : KVA_ERR_ARG;
      }
      m0 = m;
      for (i = 0; i < held; i++) {
        if (scores[i] != scores[i]) {
          kva__scored_free(c, out);
          return KVA_ERR_ARG;
        }
        if (kva__evictable(c, s, e, l, g, order[i].slot)) {
          ranked[m].score = scores[i], ranked[m].pos = order[i].pos, ranked[m].slot = order[i].slot;
          ranked[m++].head = g;
        }
      }
      out->count[(size_t)l * (size_t)c->G + (size_t)g] = 0;
      held_of[g] = held;
      held_sum += held;
      if (!e->share_heads) { /* this head's lowest go */
        gone = count >= 0 ? count : kva__excess(held, n_in, budget, m - m0);
        KVATTN_ASSERT(gone <= m - m0); /* (kva__evict_count: the fewest evictable over all heads) */
        qsort(ranked + m0, (size_t)(m - m0), sizeof ranked[0], kva__head_ranked_cmp);
        for (i = 0; i < gone; i++)
          out->victims[((size_t)l * (size_t)c->G + (size_t)g) * len + (size_t)i] = ranked[m0 + i].slot;
        out->count[(size_t)l * (size_t)c->G + (size_t)g] = (int32_t)gone;
        if (held - gone > out->new_len) out->new_len = (int)(held - gone);
      }
    }
    if (e->share_heads) { /* the layer's lowest go, whichever head holds them */
      gone = kva__excess(held_sum, n_in * c->G, budget * c->G, m);
      qsort(ranked, (size_t)m, sizeof ranked[0], kva__head_ranked_cmp);
      for (i = 0; i < gone; i++) {
        size_t hi = (size_t)l * (size_t)c->G + (size_t)ranked[i].head;
        out->victims[hi * len + (size_t)out->count[hi]++] = ranked[i].slot;
      }
      for (g = 0; g < c->G; g++) {
        long kept = held_of[g] - out->count[(size_t)l * (size_t)c->G + (size_t)g];
        if (kept > out->new_len) out->new_len = (int)kept;
      }
    }
  }
  return KVA_OK;
}

/* A uniform policy's scorer eviction: every head gives `count`, its lowest
   scores first (then the oldest); victims packed [n_layers][G][count] for
   kva__evict_apply, which also demotes. */
static inline kva_status kva__score_victims(kva_cache *c, const kva__seq *s, int seq, const kva_evict *e, int count,
                                            kva__scored *out) {
  const size_t len = (size_t)s->len, heads = (size_t)c->n_layers * (size_t)c->G;
  size_t hi;
  int i;
  kva_status st = kva__uneven_victims(c, s, seq, e, 0, count, out);
  if (st != KVA_OK) return st;
  for (hi = 0; hi < heads; hi++) /* (in place: hi * count + i <= hi * len + i) */
    for (i = 0; i < count; i++) out->victims[hi * (size_t)count + (size_t)i] = out->victims[hi * len + (size_t)i];
  out->count = NULL;
  return KVA_OK;
}

/* Every head keeps its held tokens but its victims in its first slots
   (survivors from above fill the gaps); its slots from there to new_len
   become empty. */
static inline void kva__evict_apply_uneven(kva_cache *c, kva__seq *s, const kva__scored *sc, int new_len) {
  const size_t len = (size_t)s->len;
  long empty = 0;
  int l, g, slot, k;
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++) {
      const size_t hi = (size_t)l * (size_t)c->G + (size_t)g;
      const int32_t *victims = sc->victims + hi * len;
      int held = 0, kept, src, in_block, si;
      int32_t b, sb;
      for (slot = 0; slot < s->len; slot++) {
        b = kva__slot_block(c, s, l, slot, &in_block);
        c->victim_flag[slot] = *kva__pos_ptr(c, l, b, g, in_block) == KVA_POS_EMPTY;
        held += !c->victim_flag[slot];
      }
      for (k = 0; k < sc->count[hi]; k++) c->victim_flag[victims[k]] = 1;
      kept = held - sc->count[hi];
      for (slot = 0, src = kept; slot < kept; slot++) {
        if (!c->victim_flag[slot]) continue;
        while (c->victim_flag[src]) src++;
        b = kva__slot_block(c, s, l, slot, &in_block);
        sb = kva__slot_block(c, s, l, src, &si);
        kva__slot_move(c, l, g, b, in_block, sb, si);
        src++;
      }
      for (slot = kept; slot < new_len; slot++) { /* empty: zero rows (bounds and reads see zeros), no position */
        b = kva__slot_block(c, s, l, slot, &in_block);
        memset(kva__k_ptr(c, l, b, g, in_block), 0, c->k_row[l]);
        if (c->kind == KVA_CACHE_KV) memset(kva__v_ptr(c, l, b, g, in_block), 0, c->v_row[l]);
        *kva__pos_ptr(c, l, b, g, in_block) = KVA_POS_EMPTY;
        if (c->block_score) *kva__score_ptr(c, l, b, g, in_block) = 0.0f;
      }
      for (slot = 0; slot < s->len; slot++) c->victim_flag[slot] = 0;
      empty += new_len - kept;
    }
  s->n_empty = empty;
}

/* Apply a planned eviction (victims: a scorer's, or NULL) and make e the
   active policy: copy shared blocks that compaction or scores will write,
   compact, release emptied blocks, copy a shared partly filled tail. */
static inline void kva__evict_commit(kva_cache *c, kva__seq *s, const kva_evict *e, const kva__append_plan *pl,
                                     const kva__scored *sc) {
  const int zero_scores = kva__accumulates(e) && !kva__accumulates(&s->evict);
  int i;
  s->evict = *e;
  for (i = 0; i < pl->private_to; i++)
    if (kva__block_shared(c, s->table[i])) kva__copy_on_write(c, s, i);
  /* Scores count only attention made while an accumulating policy is the
     active one: on switching to H2O every score is 0, so this eviction goes
     oldest first (a scorer saw zeros), and the kept (now private) blocks
     are zeroed after the compaction. */
  if (pl->evicts && sc->count) {
    kva__evict_apply_uneven(c, s, sc, s->len - pl->n_evict);
  } else if (pl->evicts) {
    kva_evict by_age = *e;
    if (zero_scores && e->kind == KVA_EVICT_H2O) by_age.kind = KVA_EVICT_WINDOW, by_age.n_recent = 0;
    if (kva__demotes(e)) kva__demote_begin(c, s, e, pl->n_evict);
    kva__evict_apply(c, s, &by_age, pl->n_evict, sc->victims);
    if (kva__demotes(e)) kva__demote_end(s, pl->n_evict);
  }
  if (zero_scores)
    for (i = 0; i < pl->keep_blocks; i++) {
      int l;
      for (l = 0; l < c->n_layers; l++)
        memset(kva__score_ptr(c, l, s->table[i], 0, 0), 0, (size_t)c->G * (size_t)c->bs * sizeof(float));
    }
  while (s->n_blocks > pl->keep_blocks) kva__block_release(c, s->table[--s->n_blocks]);
  s->len -= pl->n_evict;
  if (kva__tail_needs_copy(c, s)) kva__copy_on_write(c, s, s->len / c->bs);
  if (c->block_bounds && pl->evicts) /* compacted: the kept keys' own bounds */
    for (i = 0; i < c->n_layers; i++) kva__bounds_rebuild(c, s, i);
}

/* Are e's layer weights usable (each finite and above 0)? */
static inline int kva__layer_weights_ok(const kva_cache *c, const kva_evict *e) {
  int l;
  for (l = 0; e->layer_weight && l < c->n_layers; l++)
    if (!(e->layer_weight[l] > 0.0f) || e->layer_weight[l] > FLT_MAX) return 0;
  return 1;
}

/* Set or change the policy; it applies from the next kva_seq_append. */
KVA_API kva_status kva_seq_set_evict(kva_cache *c, int seq, const kva_evict *e) {
  kva__seq *s;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, kva__evict_check(e) != KVA_OK, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if ((kva__accumulates(e) && c->evict_support != KVA_EVICT_SUPPORT_ALL) ||
      (e->kind != KVA_EVICT_NONE && c->evict_support == KVA_EVICT_SUPPORT_NONE))
    return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__,
                       "the cache keeps no scores / positions for this policy (kva_cache_desc.evict_support)");
  KVA__REFUSE_WHY(c, e->kind != KVA_EVICT_NONE && !kva__layer_weights_ok(c, e), KVA_ERR_ARG,
                  "a layer_weight is not a finite number above 0");
  KVA__REFUSE_WHY(c, e->kind != KVA_EVICT_NONE && kva__uneven(e) && kva__demotes(e), KVA_ERR_UNSUPPORTED,
                  "per-layer or per-head budgets do not demote (the demoted ring holds one count per head)");
  KVA__REFUSE_WHY(c, s->n_empty > 0 && e->kind != KVA_EVICT_NONE && !kva__uneven(e), KVA_ERR_UNSUPPORTED,
                  "the sequence's heads hold different counts: keep per-layer or per-head budgets, or NONE");
  if (kva__demotes(e)) {
    KVA__REFUSE_WHY(c, e->demote_dtype != c->dt, KVA_ERR_UNSUPPORTED,
                    "e->demote_dtype is not the cache's demoted pool's type (kva_cache_desc.demote_dtype)");
    KVA__REFUSE_WHY(c, (long)e->demote_budget > (long)c->dm_max_table * c->bs, KVA_ERR_UNSUPPORTED,
                    "e->demote_budget exceeds what one sequence's demoted blocks can hold");
    KVA__REFUSE_WHY(c, s->dm_len > 0 && kva__demote_cap(c, e) != s->dm_cap, KVA_ERR_UNSUPPORTED,
                    "the sequence holds demoted tokens: a policy that demotes keeps its demote_budget");
  }
  s->evict_next = *e;
  if (e->kind == KVA_EVICT_NONE) memset(&s->evict_next, 0, sizeof s->evict_next);
  return KVA_OK;
}

/* --- growing and cutting sequences: append, fork, truncate, accept, fits --- */

/* Make room for n_tokens more tokens at the next positions: all or nothing.
   Plan: evict (policy), copy shared blocks that eviction compacts or H2O
   scores, release emptied blocks, copy a shared partial tail, take new
   blocks. Nothing is applied unless all of it fits. */
KVA_API kva_status kva_seq_append(kva_cache *c, int seq, int n_tokens) {
  kva__seq *s;
  const kva_evict *e;
  kva__append_plan pl;
  kva__scored scored = {NULL, NULL, 0, NULL, 0};
  int i, w;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_tokens < 0, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if (n_tokens == 0) return KVA_OK;
  KVA__REFUSE(c, (long)s->pos + n_tokens > (long)INT32_MAX, KVA_ERR_ARG); /* positions are int32 */
  e = &s->evict_next;
  kva__plan_append(c, s, n_tokens, &s->evict_next, &pl);
  if (kva__uneven(e) && pl.evicts) { /* the scores decide what each head keeps: they come first, then the plan */
    kva_status st = kva__uneven_victims(c, s, seq, e, n_tokens, -1, &scored);
    if (st != KVA_OK) return kva__refuse(c, st, __func__, kva__score_why(st));
    kva__plan_shrink(c, s, n_tokens, e, scored.new_len, 1, &pl);
  }
  if (!pl.fits_now) {
    kva__scored_free(c, &scored);
    c->appends_failed++;
    return kva__refuse(c, KVA_ERR_FULL, __func__, "the pool has too few free or reclaimable blocks for the append");
  }

  if (e->kind == KVA_EVICT_SCORE && pl.evicts && !scored.work) { /* the scorer first: it may refuse */
    kva_status st = kva__score_victims(c, s, seq, e, pl.n_evict, &scored);
    if (st != KVA_OK) return kva__refuse(c, st, __func__, kva__score_why(st));
  }

  /* commit */
  kva__step_begin(c, s, 0); /* (slots before any eviction: what the last step left unstored) */
  c->append_counter++;
  kva__prefix_expire(c);
  kva__evict_commit(c, s, e, &pl, &scored);
  kva__scored_free(c, &scored);
  for (w = 0; w < c->n_spans; w++) { /* (the step's queries sit at s->len and later) */
    kva__span *sp = &c->spans[w];
    int32_t *t = kva__span_table(c, s, w);
    int b;
    kva__span_release_before(c, s, w, s->len);
    if (s->len % c->bs && s->len / c->bs < s->n_blocks && sp->ref[t[s->len / c->bs]] > 1)
      kva__span_copy_on_write(c, s, w, s->len / c->bs);
    for (b = s->n_blocks; b < kva__blocks_for(c, (long)s->len + n_tokens); b++) t[b] = kva__span_take(sp);
  }
  while (s->n_blocks < kva__blocks_for(c, (long)s->len + n_tokens)) s->table[s->n_blocks++] = kva__block_take(c);
  for (i = 0; i < n_tokens; i++) kva__slot_init(c, s, s->len + i, (int32_t)(s->pos + i));
  s->len += n_tokens;
  s->pos += n_tokens;
  s->last_append = n_tokens;
  return KVA_OK;
}

/* Evict now, down to `budget` tokens, with the sequence's policy (one-shot
   prompt compression after prefill): planned, scored and checked first, as
   an append's eviction, then applied; the step ends. */
KVA_API kva_status kva_seq_compress(kva_cache *c, int seq, int budget) {
  kva__seq *s;
  kva_evict e;
  kva__append_plan pl;
  kva__scored scored = {NULL, NULL, 0, NULL, 0};
  int l;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, budget < 1, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE_WHY(c, s->evict_next.kind == KVA_EVICT_NONE, KVA_ERR_ARG,
                  "kva_seq_compress evicts by the sequence's policy: set one with kva_seq_set_evict");
  for (l = 0; l < c->n_layers; l++)
    KVA__REFUSE_WHY(c, !kva__step_stored(s, l), KVA_ERR_NOT_STORED,
                    "the step's tokens are not all stored in every layer: kva_store them before compressing");
  e = s->evict_next;
  e.budget = budget;
  e.rollback = 0;
  kva__plan_append(c, s, 0, &e, &pl);
  if (kva__uneven(&e) && pl.evicts) {
    kva_status st = kva__uneven_victims(c, s, seq, &e, 0, -1, &scored);
    if (st != KVA_OK) return kva__refuse(c, st, __func__, kva__score_why(st));
    kva__plan_shrink(c, s, 0, &e, scored.new_len, 1, &pl);
  }
  if (!pl.fits_now) {
    kva__scored_free(c, &scored);
    return kva__refuse(c, KVA_ERR_FULL, __func__, "too few free blocks to copy the shared ones");
  }
  if (e.kind == KVA_EVICT_SCORE && pl.evicts && !scored.work) {
    kva_status st = kva__score_victims(c, s, seq, &e, pl.n_evict, &scored);
    if (st != KVA_OK) return kva__refuse(c, st, __func__, kva__score_why(st));
  }
  kva__step_begin(c, s, 0);
  kva__evict_commit(c, s, &e, &pl, &scored);
  s->evict = s->evict_next; /* the policy's own budget from here on */
  kva__scored_free(c, &scored);
  return KVA_OK;
}

/* The built-in scorers (docs/API.md, "Eviction scorers"). Knorm (Devoto et
   al. 2024): the keys with the smallest L2 norm draw the most attention, so
   they stay. */
KVA_API kva_status kva_score_key_norm(void *user, const kva_score_view *view, float *scores) {
  int j, i;
  (void)user;
  if (!view || !scores || !view->k || view->n < 0 || view->head_dim < 1) return KVA_ERR_ARG;
  for (j = 0; j < view->n; j++) {
    const float *k = view->k + (size_t)j * (size_t)view->head_dim;
    double ss = 0.0;
    for (i = 0; i < view->head_dim; i++) ss += (double)k[i] * (double)k[i];
    scores[j] = (float)-sqrt(ss);
  }
  return KVA_OK;
}

/* PyramidKV's layer budgets (Cai et al. 2024, arXiv:2406.02069, as its
   code computes them) as kva_evict.layer_weight: every layer keeps the
   n_window newest tokens, and the rest of the budget, budget - n_window on
   average, falls with depth in equal steps from 2 (budget - n_window) - m
   at layer 0 to m = (budget - n_window) / beta at the last. Weights average
   1, so the layers together keep n_layers x budget. */
KVA_API kva_status kva_pyramid_weights(int n_layers, int budget, int n_window, float beta, float *weights) {
  double rest, least, most, step;
  int l;
  if (n_layers < 1 || budget < 1 || n_window < 0 || n_window >= budget || !(beta >= 1.0f) || beta > FLT_MAX ||
      !weights)
    return KVA_ERR_ARG;
  rest = (double)budget - n_window;
  least = rest / (double)beta;
  most = 2.0 * rest - least;
  step = n_layers > 1 ? (most - least) / (n_layers - 1) : 0.0;
  for (l = 0; l < n_layers; l++) weights[l] = (float)((n_window + (n_layers > 1 ? most - l * step : rest)) / budget);
  return KVA_OK;
}

/* TOVA (the current query's attention) and SnapKV (the observation window's,
   pooled): the attention the given queries of this layer and KV group pay
   each held key, summed in double; then average pooling over slots. */
KVA_API kva_status kva_score_attention(void *user, const kva_score_view *view, float *scores) {
  const kva_score_queries *Q = (const kva_score_queries *)user;
  int R, t, h, j, d, n, half;
  double scale, *raw;
  size_t per_layer;
  if (!Q || !view || !scores || !view->k || !view->pos || !Q->q || Q->n_q < 1 || view->n < 0 || view->n_kv_heads < 1 ||
      Q->n_heads < view->n_kv_heads || Q->n_heads % view->n_kv_heads != 0 || Q->scale < 0.0f || !(Q->scale == Q->scale) ||
      Q->pool < 0 || (Q->pool > 1 && Q->pool % 2 == 0) || view->layer < 0 || view->layer >= view->n_layers ||
      view->kv_head < 0 || view->kv_head >= view->n_kv_heads || view->head_dim < 1)
    return KVA_ERR_ARG;
  per_layer = (size_t)Q->n_q * (size_t)Q->n_heads * (size_t)view->head_dim; /* one layer's queries, packed */
  if (Q->layer_stride && Q->layer_stride < per_layer) return KVA_ERR_ARG;  /* layers would overlap */
  if (Q->layer_stride) per_layer = Q->layer_stride;
  n = view->n;
  if (n == 0) return KVA_OK;
  R = Q->n_heads / view->n_kv_heads;
  scale = Q->scale > 0.0f ? (double)Q->scale : 1.0 / sqrt((double)view->head_dim);
  /* the sums in double, and one query head's exponentials: 2n doubles */
  raw = (double *)KVATTN_MALLOC((size_t)n * 2 * sizeof(double));
  if (!raw) return KVA_ERR_NOMEM;
  for (j = 0; j < n; j++) raw[j] = 0.0;
  for (t = 0; t < Q->n_q; t++) {
    const int at = n - Q->n_q + t; /* without q_pos: the position of the at-th oldest held token */
    int32_t qp;
    if (!Q->q_pos && at < 0) continue; /* fewer keys held than queries: the first see none */
    qp = Q->q_pos ? Q->q_pos[t] : view->pos[at];
    for (h = view->kv_head * R; h < view->kv_head * R + R; h++) {
      const float *q = Q->q + (size_t)view->layer * per_layer + ((size_t)t * (size_t)Q->n_heads + (size_t)h) * (size_t)view->head_dim;
      double mx = -HUGE_VAL, sum = 0.0, *e = raw + n;
      for (j = 0; j < n; j++) {
        const float *k = view->k + (size_t)j * (size_t)view->head_dim;
        double x = 0.0;
        if (view->pos[j] > qp) { e[j] = -HUGE_VAL; continue; }
        for (d = 0; d < view->head_dim; d++) x += (double)q[d] * (double)k[d];
        e[j] = scale * x;
        if (e[j] > mx) mx = e[j];
      }
      if (mx == -HUGE_VAL) continue;
      for (j = 0; j < n; j++) sum += e[j] = e[j] == -HUGE_VAL ? 0.0 : exp(e[j] - mx);
      for (j = 0; j < n; j++) raw[j] += e[j] / sum;
    }
  }
  half = Q->pool > 1 ? Q->pool / 2 : 0;
  for (j = 0; j < n; j++) {
    double acc = 0.0;
    for (d = j - half; d <= j + half; d++)
      if (d >= 0 && d < n) acc += raw[d];
    scores[j] = (float)(half ? acc / (double)Q->pool : acc);
  }
  KVATTN_FREE(raw);
  return KVA_OK;
}

/* Append n_tokens[i] to seqs[i] for every i, or to none (batch admission).
   The plans are made against the pool as it is now and chained: each
   append's copies and new blocks come out of what the ones before it left,
   including the blocks their eviction empties. Later appends can only need
   less than planned (an earlier copy unshares blocks), so a passing check
   means every append succeeds. */
KVA_API kva_status kva_seq_append_all(kva_cache *c, const int *seqs, const int *n_tokens, int n_seqs) {
  long avail, span_avail[KVA_MAX_GROUPS], dm_avail;
  int i, j;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_tokens)), KVA_ERR_ARG);
  for (i = 0; i < n_seqs; i++) {
    const kva__seq *s = kva__seq_get(c, seqs[i]);
    if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
    KVA__REFUSE(c, n_tokens[i] < 0 || (long)s->pos + n_tokens[i] > (long)INT32_MAX, KVA_ERR_ARG);
    for (j = 0; j < i; j++)
      KVA__REFUSE(c, seqs[j] == seqs[i], KVA_ERR_ARG);
  }
  avail = (long)c->n_free + c->n_cached;
  dm_avail = c->dm_n_free;
  for (j = 0; j < c->n_spans; j++) span_avail[j] = kva__span_avail(&c->spans[j]);
  for (i = 0; i < n_seqs; i++) {
    kva__append_plan pl;
    const kva__seq *s = kva__seq_get(c, seqs[i]);
    int short_of_blocks = 0;
    if (n_tokens[i] == 0) continue;
    kva__plan_append(c, s, n_tokens[i], &s->evict_next, &pl);
    if (pl.evicts && s->evict_next.kind == KVA_EVICT_SCORE)
      return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__,
                         "a scorer may refuse: append a sequence that evicts by KVA_EVICT_SCORE with kva_seq_append");
    for (j = 0; j < c->n_spans; j++) {
      short_of_blocks |= pl.span_need[j] > span_avail[j] + pl.span_releasable[j];
      span_avail[j] += pl.span_releasable[j] - pl.span_need[j];
    }
    short_of_blocks |= pl.dm_take > dm_avail;
    dm_avail -= pl.dm_take;
    if (!pl.fits_table || pl.copies > avail || pl.copies + pl.fresh > avail + pl.releasable || short_of_blocks) {
      c->appends_failed++;
      return kva__refuse(c, KVA_ERR_FULL, __func__, "the pool has too few free or reclaimable blocks for the appends");
    }
    avail += pl.releasable - pl.copies - pl.fresh;
  }
  for (i = 0; i < n_seqs; i++) {
    kva_status st = kva_seq_append(c, seqs[i], n_tokens[i]);
    KVATTN_ASSERT(st == KVA_OK);
    (void)st;
  }
  return KVA_OK;
}

/* A child sharing every block of src (copy-on-write); takes no block. */
KVA_API kva_status kva_seq_fork(kva_cache *c, int src, int *dst) {
  kva__seq *s, *d;
  int i, w, id, gen;
  int32_t *table, *stored, *span_table, *span_from, *dm_table;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !dst, KVA_ERR_ARG);
  s = kva__seq_get(c, src);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE_WHY(c, s->dm_n_blocks > c->dm_n_free, KVA_ERR_FULL,
                  "the demoted pool has too few free blocks for the child's copy of the demoted region");
  d = kva__seq_alloc(c, &id);
  KVA__REFUSE_WHY(c, !d, KVA_ERR_SEQ_LIMIT, "max_seqs sequences are live");
  kva__step_begin(c, s, 0); /* the newest blocks are shared now */
  gen = d->gen;
  table = d->table;
  stored = d->stored;
  span_table = d->span_table;
  span_from = d->span_from;
  dm_table = d->dm_table;
  *d = *s;
  d->gen = gen;
  d->table = table;
  d->stored = stored;
  d->span_table = span_table;
  d->span_from = span_from;
  d->dm_table = dm_table;
  for (i = 0; i < s->dm_n_blocks; i++) { /* the demoted region is copied, not shared: the ring rewrites in place */
    int32_t from = s->dm_table[i], to = c->dm_free[--c->dm_n_free];
    int l;
    d->dm_table[i] = to;
    for (l = 0; l < c->n_layers; l++) {
      memcpy(kva__dm_k_ptr(c, l, to, 0, 0), kva__dm_k_ptr(c, l, from, 0, 0), c->dm_block);
      memcpy(kva__dm_pos_ptr(c, l, to, 0, 0), kva__dm_pos_ptr(c, l, from, 0, 0),
             (size_t)c->G * (size_t)c->bs * sizeof(int32_t));
    }
  }
  memcpy(d->table, s->table, (size_t)s->n_blocks * sizeof(int32_t));
  for (i = 0; i < s->n_blocks; i++) kva__block_ref(c, s->table[i]);
  for (w = 0; w < c->n_spans; w++) {
    const int32_t *from = kva__span_table(c, s, w);
    memcpy(kva__span_table(c, d, w), from, (size_t)s->n_blocks * sizeof(int32_t));
    for (i = 0; i < s->n_blocks; i++)
      if (from[i] != kva__span_hole(&c->spans[w])) kva__span_hold(&c->spans[w], from[i]);
    d->span_from[w] = s->span_from[w];
  }
  /* policy and H2O scores travel with the fork (the scores live in the shared blocks) */
  *dst = id;
  return KVA_OK;
}

/* Keep the first n_keep tokens; shared or published blocks are left as they are. */
KVA_API kva_status kva_seq_truncate(kva_cache *c, int seq, int n_keep) {
  kva__seq *s;
  int keep_blocks;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_keep < 0, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE(c, n_keep > s->len, KVA_ERR_ARG);
  /* after eviction a slot is no longer its position, except in the newest
     step: its tokens were appended after the eviction, at the end */
  KVA__REFUSE(c, (s->pos != s->len || s->n_empty > 0) && n_keep < s->len - s->last_append, KVA_ERR_UNSUPPORTED);
  /* a WINDOW / CHUNK group must still hold what the next query sees */
  KVA__REFUSE(c, !kva__spans_hold(c, s, n_keep), KVA_ERR_UNSUPPORTED);
  keep_blocks = kva__blocks_for(c, n_keep);
  kva__spans_drop_from(c, s, keep_blocks);
  while (s->n_blocks > keep_blocks) kva__block_release(c, s->table[--s->n_blocks]);
  kva__step_begin(c, s, 0);
  if (s->unstored_from >= n_keep) s->unstored_from = INT_MAX;
  s->pos -= s->len - n_keep;
  s->len = n_keep;
  return KVA_OK;
}


/* Of the newest n_new tokens keep those listed in keep (ascending indices
   into them) and drop the rest: the kept ones move down to consecutive
   slots and positions, as if only they had been appended (the accepted path
   of a speculative tree). All or nothing: shared blocks it rewrites are
   copied first, and if the pool cannot give them nothing changes. */
KVA_API kva_status kva_seq_accept(kva_cache *c, int seq, int n_new, const int32_t *keep, int n_keep) {
  kva__seq *s;
  int j, l, g, first, start, new_len, unstored, kept_stored;
  long copies = 0;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_new < 0 || n_keep < 0 || n_keep > n_new || (n_keep > 0 && !keep), KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE(c, n_new > s->len, KVA_ERR_ARG);
  for (j = 0; j < n_keep; j++)
    KVA__REFUSE(c, keep[j] < 0 || keep[j] >= n_new || (j > 0 && keep[j] <= keep[j - 1]), KVA_ERR_ARG);
  /* after eviction only the newest step's slots are still its positions, in order */
  KVA__REFUSE(c, (s->pos != s->len || s->n_empty > 0) && n_new > s->last_append, KVA_ERR_UNSUPPORTED);
  start = s->len - n_new;
  new_len = start + n_keep;
  for (first = 0; first < n_keep && keep[first] == first; first++) {
  } /* the kept tokens before `first` are in place already */
  /* a WINDOW / CHUNK group must still hold the tokens that move and what the next query sees */
  KVA__REFUSE(c, !kva__spans_hold(c, s, start), KVA_ERR_UNSUPPORTED);
  if (first < n_keep) { /* blocks of slots start + first .. new_len - 1 are rewritten */
    int b, w;
    for (b = (start + first) / c->bs; b < kva__blocks_for(c, new_len); b++) copies += kva__block_shared(c, s->table[b]);
    KVA__REFUSE(c, copies > (long)c->n_free + c->n_cached, KVA_ERR_FULL);
    for (w = 0; w < c->n_spans; w++) {
      const int32_t *t = kva__span_table(c, s, w);
      long span_copies = 0;
      for (b = (start + first) / c->bs; b < kva__blocks_for(c, new_len); b++) span_copies += c->spans[w].ref[t[b]] > 1;
      KVA__REFUSE(c, span_copies > kva__span_avail(&c->spans[w]), KVA_ERR_FULL);
    }
  }

  /* commit */
  unstored = kva__first_unstored(c, s);
  for (kept_stored = 0; kept_stored < n_keep && start + keep[kept_stored] < unstored; kept_stored++) {
  }
  kva__step_begin(c, s, 0);
  unstored = unstored <= start ? unstored : start + kept_stored; /* where the first unstored kept token lands */
  s->unstored_from = unstored < new_len ? unstored : INT_MAX;
  if (first < n_keep) {
    int b, w;
    for (b = (start + first) / c->bs; b < kva__blocks_for(c, new_len); b++) {
      if (kva__block_shared(c, s->table[b])) kva__copy_on_write(c, s, b);
      for (w = 0; w < c->n_spans; w++)
        if (c->spans[w].ref[kva__span_table(c, s, w)[b]] > 1) kva__span_copy_on_write(c, s, w, b);
    }
  }
  for (j = first; j < n_keep; j++) { /* slot start + j < start + keep[j]: moves go down, never over a source */
    for (l = 0; l < c->n_layers; l++) {
      int di, si;
      int32_t db = kva__slot_block(c, s, l, start + j, &di), sb = kva__slot_block(c, s, l, start + keep[j], &si);
      for (g = 0; g < c->G; g++) {
        memcpy(kva__k_ptr(c, l, db, g, di), kva__k_ptr(c, l, sb, g, si), c->k_row[l]);
        if (c->kind == KVA_CACHE_KV) memcpy(kva__v_ptr(c, l, db, g, di), kva__v_ptr(c, l, sb, g, si), c->v_row[l]);
        if (c->block_pos) *kva__pos_ptr(c, l, db, g, di) = (int32_t)(s->pos - n_new + j);
        if (c->block_score) *kva__score_ptr(c, l, db, g, di) = *kva__score_ptr(c, l, sb, g, si);
      }
    }
  }
  kva__spans_drop_from(c, s, kva__blocks_for(c, new_len));
  while (s->n_blocks > kva__blocks_for(c, new_len)) kva__block_release(c, s->table[--s->n_blocks]);
  s->pos -= n_new - n_keep;
  s->len = new_len;
  if (c->block_bounds)
    for (l = 0; l < c->n_layers; l++) kva__bounds_rebuild(c, s, l);
  return KVA_OK;
}

/* Would an append of n_tokens succeed now, once other sequences release
   their blocks, or never in this pool; *blocks_needed = blocks it takes. */
KVA_API kva_fit kva_seq_fits(const kva_cache *c, int seq, int n_tokens, int *blocks_needed) {
  const kva__seq *s = kva__seq_get(c, seq);
  kva__append_plan pl;
  int w;
  if (!s || n_tokens < 0) return KVA_FITS_NEVER;
  if ((long)s->pos + n_tokens > (long)INT32_MAX) return KVA_FITS_NEVER;
  if (n_tokens == 0) {
    if (blocks_needed) *blocks_needed = 0;
    return KVA_FITS_NOW;
  }
  kva__plan_append(c, s, n_tokens, &s->evict_next, &pl);
  if (blocks_needed) *blocks_needed = (int)(pl.copies + pl.fresh);
  if (pl.fits_now) return KVA_FITS_NOW;
  /* once every other sequence let go, nothing is shared: the sequence needs its own blocks only */
  if (kva__blocks_for(c, (long)s->len - pl.n_evict + n_tokens) > c->max_table) return KVA_FITS_NEVER;
  for (w = 0; w < c->n_spans; w++) { /* and in each group what it holds after the append */
    const kva__span *sp = &c->spans[w];
    int to = kva__span_first_block(c, sp, s->len), released;
    if (to > s->n_blocks) to = s->n_blocks;
    released = (to > s->span_from[w] ? to : s->span_from[w]) - kva__span_sink_blocks(c, sp);
    if (kva__blocks_for(c, (long)s->len + n_tokens) - (released > 0 ? released : 0) > sp->n_blocks)
      return KVA_FITS_NEVER;
  }
  return KVA_FITS_LATER;
}

/* --- prefix caching --- */

/* Block b joins the prefix table under (parent's publication, salt, tok) */
static inline void kva__publish_one(kva_cache *c, int32_t b, int32_t parent, uint64_t salt, const int32_t *tok) {
  kva__block *k = &c->blk[b];
  k->published = 1;
  k->pub_gen = ++c->pub_counter;
  k->parent = parent;
  k->parent_gen = parent >= 0 ? c->blk[parent].pub_gen : 0;
  k->salt = salt;
  k->hash = kva__prefix_hash(parent, k->parent_gen, salt, tok, c->bs);
  memcpy(c->blk_tokens + (size_t)b * (size_t)c->bs, tok, (size_t)c->bs * sizeof(int32_t));
  k->hnext = c->buckets[k->hash & c->bucket_mask];
  c->buckets[k->hash & c->bucket_mask] = b;
  k->first_child = k->prev_sib = -1;
  k->next_sib = -1;
  if (parent >= 0) {
    k->next_sib = c->blk[parent].first_child;
    if (k->next_sib >= 0) c->blk[k->next_sib].prev_sib = b;
    c->blk[parent].first_child = b;
  }
  if (c->spill) kva_prefix_key(parent >= 0 ? c->blk[parent].key : NULL, salt, tok, c->bs, k->key);
}

/* Publish the sequence's first n_full blocks under (salt, tokens), each
   under its parent's publication; a key another block already holds
   carries the chain on through that block. */
static inline void kva__publish_blocks(kva_cache *c, const kva__seq *s, const int32_t *tokens, int n_full,
                                       uint64_t salt) {
  int i, w;
  int32_t parent = -1;
  uint64_t parent_gen = 0;
  for (i = 0; i < n_full; i++) {
    const int32_t *tok = tokens + (size_t)i * (size_t)c->bs;
    int32_t b = s->table[i], have = kva__prefix_find(c, parent, parent_gen, salt, tok);
    if (have < 0 && !c->blk[b].published) {
      for (w = 0; w < c->n_spans; w++) kva__span_publish(&c->spans[w], b, kva__span_table(c, s, w)[i]);
      kva__publish_one(c, b, parent, salt, tok);
      have = b;
    } else if (have < 0) {
      break; /* published under another key: the chain under this key ends here */
    }
    parent = have; /* the canonical block of this key carries the chain on */
    parent_gen = c->blk[have].pub_gen;
  }
}

/* Block i of a prefix (token ids tok) that memory does not hold, from the
   tier: asked by its key, verified, then copied into a block of the pool
   (a free one, else the least recently used cached one, which spills) and
   published under parent. The block comes back held once; -1: a miss. */
static inline int32_t kva__tier_fetch(kva_cache *c, int i, int32_t parent, uint64_t salt, const int32_t *tok) {
  uint8_t parent_key[32], key[32];
  size_t size = 0;
  int32_t b;
  if (c->n_free + c->n_cached == 0) return -1; /* nowhere to put it */
  if (parent >= 0) memcpy(parent_key, c->blk[parent].key, 32);
  else memset(parent_key, 0, 32);
  kva_prefix_key(parent >= 0 ? parent_key : NULL, salt, tok, c->bs, key);
  if (c->fetch(c->tier_user, key, c->tier_in, c->tier_bytes, &size) != KVA_OK) {
    c->tier_fetch_misses++;
    return -1;
  }
  if (size > c->tier_bytes || !kva__tier_record_ok(c, c->tier_in, size, key, parent_key, salt, tok)) {
    c->tier_fetch_refused++;
    return -1;
  }
  b = kva__block_take(c);
  kva__tier_decode(c, b, c->tier_in, i);
  kva__publish_one(c, b, parent, salt, tok);
  c->tier_fetch_hits++;
  return b;
}

/* Make the full blocks holding the first n_tokens tokens reusable under
   (salt, tokens). A block keeps the first key it was published under. */
KVA_API kva_status kva_seq_publish(kva_cache *c, int seq, const int32_t *tokens, int n_tokens, uint64_t salt) {
  kva__seq *s;
  int n_full;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_tokens < 0 || (n_tokens > 0 && !tokens), KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE(c, n_tokens > s->len, KVA_ERR_ARG);
  KVA__REFUSE(c, s->pos != s->len || s->n_empty > 0, KVA_ERR_UNSUPPORTED); /* evicted: slots are not token ids */
  if (n_tokens == 0) return KVA_OK;
  n_full = n_tokens / c->bs;
  KVA__REFUSE_WHY(c, (long)n_full * c->bs > (long)kva__first_unstored(c, s), KVA_ERR_NOT_STORED,
                  "a block to publish holds tokens not stored in every layer");
  kva__step_begin(c, s, 0); /* its blocks may be shared from now on */
  kva__publish_blocks(c, s, tokens, n_full, salt);
  return KVA_OK;
}


/* Do the groups keep, for the first n published blocks, what a query after
   them sees (the window's blocks and the sinks')? */
static inline int kva__spans_published(const kva_cache *c, const int32_t *table, int n) {
  int w, i;
  for (w = 0; w < c->n_spans; w++) {
    const kva__span *sp = &c->spans[w];
    int first = kva__span_first_block(c, sp, (long)n * c->bs), sinks = kva__span_sink_blocks(c, sp);
    for (i = 0; i < n; i++)
      if ((i < sinks || i >= first) && sp->pub_block[table[i]] < 0) return 0;
  }
  return 1;
}

/* A new sequence holding the longest run of published full blocks that
   match (salt, tokens), at most n_tokens - 1 tokens. */
KVA_API kva_status kva_seq_new_prefix(kva_cache *c, const int32_t *tokens, int n_tokens, uint64_t salt, int *seq,
                                      int *n_reused) {
  kva__seq *s;
  int id, i, w, max_blocks;
  int32_t parent = -1;
  uint64_t parent_gen = 0;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !seq || !n_reused || n_tokens < 0 || (n_tokens > 0 && !tokens), KVA_ERR_ARG);
  s = kva__seq_alloc(c, &id);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ_LIMIT, __func__, "max_seqs sequences are live");
  max_blocks = n_tokens > 0 ? (n_tokens - 1) / c->bs : 0;
  if (c->fetch) { /* a prefix tier: each block held as it is found, so a fetch's new block never recycles one */
    for (i = 0; i < max_blocks; i++) {
      const int32_t *tok = tokens + (size_t)i * (size_t)c->bs;
      int32_t b = kva__prefix_find(c, parent, parent_gen, salt, tok);
      if (b >= 0) kva__block_ref(c, b);
      else if ((b = kva__tier_fetch(c, i, parent, salt, tok)) < 0) break;
      c->blk[b].last_use = c->append_counter;
      s->table[s->n_blocks++] = b;
      parent = b;
      parent_gen = c->blk[b].pub_gen;
    }
    s->len = s->pos = s->n_blocks * c->bs; /* (no layer groups with a tier) */
    c->prefix_queries += n_tokens;
    c->prefix_hits += s->len;
    *seq = id;
    *n_reused = s->len;
    return KVA_OK;
  }
  for (i = 0; i < max_blocks; i++) {
    int32_t b = kva__prefix_find(c, parent, parent_gen, salt, tokens + (size_t)i * (size_t)c->bs);
    if (b < 0) break;
    s->table[s->n_blocks++] = b;
    parent = b;
    parent_gen = c->blk[b].pub_gen;
  }
  while (s->n_blocks > 0 && !kva__spans_published(c, s->table, s->n_blocks))
    s->n_blocks--; /* a group no longer has the window's tokens: a shorter hit */
  for (i = 0; i < s->n_blocks; i++) {
    kva__block_ref(c, s->table[i]);
    c->blk[s->table[i]].last_use = c->append_counter;
  }
  for (w = 0; w < c->n_spans; w++) {
    kva__span *sp = &c->spans[w];
    int first = kva__span_first_block(c, sp, (long)s->n_blocks * c->bs), sinks = kva__span_sink_blocks(c, sp);
    int32_t *t = kva__span_table(c, s, w);
    for (i = 0; i < s->n_blocks; i++) {
      t[i] = i < sinks || i >= first ? sp->pub_block[s->table[i]] : kva__span_hole(sp);
      if (t[i] != kva__span_hole(sp)) kva__span_hold(sp, t[i]);
    }
    s->span_from[w] = first > sinks ? first : sinks;
  }
  s->len = s->pos = s->n_blocks * c->bs;
  c->prefix_queries += n_tokens;
  c->prefix_hits += s->len;
  *seq = id;
  *n_reused = s->len;
  return KVA_OK;
}

/* Forget every published block (after new weights or new FP8 scales). */
KVA_API kva_status kva_cache_reset_prefix(kva_cache *c) {
  int b;
  long forgotten;
  KVA__REFUSE(c, !c, KVA_ERR_ARG);
  forgotten = c->prefix_forgotten; /* (counts what age or room forgets, not a reset) */
  c->tier_quiet = 1; /* forgotten on purpose: nothing goes to the tier */
  for (b = 0; b < c->n_blocks; b++)
    if (c->blk[b].published) kva__unpublish(c, b);
  c->tier_quiet = 0;
  c->prefix_forgotten = forgotten;
  return KVA_OK;
}

/* Bytes of one prefix-tier record of this cache (0: the cache has no tier). */
KVA_API size_t kva_prefix_record_size(const kva_cache *c) { return c && c->spill ? c->tier_bytes : 0; }

/* Hand every published block to the tier's spill, keeping it (a shutdown's
   save: a later process fetches them); parents before their children.
   *n_saved: the records spill accepted. */
KVA_API kva_status kva_prefix_save(kva_cache *c, int *n_saved) {
  int32_t *stack;
  int b, top, saved = 0;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !n_saved, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, !c->spill, KVA_ERR_UNSUPPORTED, "the cache has no prefix tier (kva_cache_desc.spill)");
  stack = c->victims; /* n_blocks * bs >= published blocks */
  for (b = 0; b < c->n_blocks; b++) {
    if (!c->blk[b].published || c->blk[b].parent >= 0) continue;
    top = 0;
    stack[top++] = b;
    while (top > 0) { /* depth first from each first block: a parent before its children */
      int32_t x = stack[--top], ch;
      long errors = c->tier_spill_errors;
      kva__tier_spill(c, x);
      saved += c->tier_spill_errors == errors;
      for (ch = c->blk[x].first_child; ch >= 0; ch = c->blk[ch].next_sib) stack[top++] = ch;
    }
  }
  *n_saved = saved;
  return KVA_OK;
}

/* The published block whose tier key is key, or -1 (one pass over the pool:
   loading is rare, lookups go through the hash table) */
static inline int32_t kva__block_with_key(const kva_cache *c, const uint8_t key[32]) {
  int32_t b;
  for (b = 0; b < c->n_blocks; b++)
    if (c->blk[b].published && memcmp(c->blk[b].key, key, 32) == 0) return b;
  return -1;
}

/* Take one record (read back from a store, a file, a stream) into the
   prefix cache now, published and cached as if this cache had published
   and released it. The record is untrusted: it must be one of this cache's
   shape and types whose key is the key of its own parent key, salt and
   token ids; its parent must already be in memory. Only a free block is
   used: a load never pushes out what the cache holds. */
KVA_API kva_status kva_prefix_load(kva_cache *c, const void *record, size_t size, int *outcome) {
  static const uint8_t no_parent[32] = {0};
  uint8_t key[32], parent_key[32], own_key[32];
  const int32_t *tok;
  uint64_t salt;
  int32_t parent = -1, b;
  int depth = 0;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !record || !outcome, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, !c->spill, KVA_ERR_UNSUPPORTED, "the cache has no prefix tier (kva_cache_desc.spill)");
  KVA__REFUSE_WHY(c, size != c->tier_bytes, KVA_ERR_STREAM, "size is not kva_prefix_record_size(c)");
  memcpy(c->tier_in, record, size); /* aligned for the token ids, and read once */
  memcpy(key, c->tier_in + 24, 32);
  memcpy(parent_key, c->tier_in + 56, 32);
  memcpy(&salt, c->tier_in + 88, 8);
  tok = (const int32_t *)(const void *)(c->tier_in + KVA__TIER_HEADER + (size_t)c->n_layers * (8 + 8 * (size_t)c->G));
  KVA__REFUSE_WHY(c, !kva__tier_record_ok(c, c->tier_in, size, key, parent_key, salt, tok), KVA_ERR_STREAM,
                  "not a verified record of this cache (checksum, magic, version, shape, types or FP8 scales)");
  kva_prefix_key(memcmp(parent_key, no_parent, 32) != 0 ? parent_key : NULL, salt, tok, c->bs, own_key);
  KVA__REFUSE_WHY(c, memcmp(own_key, key, 32) != 0, KVA_ERR_STREAM,
                  "the record's key is not kva_prefix_key of its parent's key, salt and token ids");
  if (memcmp(parent_key, no_parent, 32) != 0) {
    int32_t a;
    if ((parent = kva__block_with_key(c, parent_key)) < 0) {
      *outcome = KVA_PREFIX_NO_PARENT;
      return KVA_OK;
    }
    /* (a chain keeps one salt: a lookup under the parent's could never reach this block) */
    KVA__REFUSE_WHY(c, c->blk[parent].salt != salt, KVA_ERR_STREAM, "the record's salt is not its parent's");
    for (a = parent; a >= 0; a = c->blk[a].parent) depth++; /* the blocks before it: its slots' positions */
  }
  if (kva__prefix_find(c, parent, parent >= 0 ? c->blk[parent].pub_gen : 0, salt, tok) >= 0) {
    *outcome = KVA_PREFIX_IN_MEMORY;
    return KVA_OK;
  }
  KVA__REFUSE_WHY(c, c->n_free == 0, KVA_ERR_FULL, "no free block (a load never recycles a cached one)");
  b = kva__block_take(c);
  kva__tier_decode(c, b, c->tier_in, depth);
  kva__publish_one(c, b, parent, salt, tok);
  kva__block_release(c, b); /* cached: unreferenced, reusable, recyclable */
  c->tier_loads++;
  *outcome = KVA_PREFIX_LOADED;
  return KVA_OK;
}

/* --- sequence streams (kva_seq_export / kva_seq_import) ---
   A sequence's whole state as bytes, in the writer's byte order:
     header   magic "kvattnSQ", u32 version (2), u32 byte-order mark
              0x01020304, u64 stream size; u32 kind, n_layers, n_kv_heads,
              head_dim, v_dim, block_size (the writer's), flags (1: positions,
              2: H2O scores follow the rows, 4: spans, 8 / 16: K / V rows
              stored rotated); i32 len, pos, the step's token
              count, first unstored slot (-1: none); the active and the next
              eviction policy (5 x i32 each: kind, budget, n_sink, n_recent,
              rollback); i32 prefix tokens, u32 0, u64 prefix salt
     layers   per layer: u32 K and V dtype, i32 the step's stored range
              [from, to), f32 FP8 scales of K, then of V, per KV head
     spans    (flag 4: the cache has WINDOW / CHUNK groups) per layer i32
              its group's kind, window, n_sink, chunk_size (FULL: zeros)
     prefix   i32 token ids of the leading blocks the prefix cache knows
     rows     per layer and KV head: len K rows as stored (INT8: scale and
              codes), len V rows (KV caches), then len i32 positions and
              len f32 scores if flagged; a token its group released is
              zeros
     u64      checksum of every byte before it (kva__stream_checksum)
   Rows are per token, so the reader's block size may differ. */
#define KVA__STREAM_MAGIC "kvattnSQ"
#define KVA__STREAM_VERSION 2u /* 2: INT4 group scales and minimums as F16 */
#define KVA__STREAM_ORDER 0x01020304u
#define KVA__STREAM_POS 1u
#define KVA__STREAM_SCORES 2u
#define KVA__STREAM_SPANS 4u
#define KVA__STREAM_ROTATE_SHIFT 3 /* flags 8, 16: rows stored rotated (kva_cache_desc.rotate K, V) */
#define KVA__STREAM_HEADER 128 /* bytes before the layers */

/* 64-bit checksum: four lanes of 8-byte words, each step a bijection of the
   lane, so any one changed word always changes the result. */
static inline uint64_t kva__stream_mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 31);
}
static inline uint64_t kva__stream_checksum(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t lane[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
  uint64_t w, h = (uint64_t)n * 0xc4ceb9fe1a85ec53ull;
  size_t i = 0;
  int k;
  for (; i + 32 <= n; i += 32)
    for (k = 0; k < 4; k++) {
      memcpy(&w, b + i + 8 * (size_t)k, 8);
      lane[k] = kva__stream_mix(lane[k], w);
    }
  for (k = 0; i < n; i += 8, k = (k + 1) & 3) {
    w = 0;
    memcpy(&w, b + i, n - i < 8 ? n - i : 8);
    lane[k] = kva__stream_mix(lane[k], w);
  }
  for (k = 0; k < 4; k++) h = kva__stream_mix(h, lane[k]);
  return h;
}

/* Leading blocks of s that the prefix cache knows as one chain under one
   salt, fully stored and before the step. */
static inline int kva__seq_prefix_blocks(const kva_cache *c, const kva__seq *s) {
  int i, limit = s->len - s->last_append, unstored = kva__first_unstored(c, s);
  if (unstored < limit) limit = unstored;
  if (s->pos != s->len || s->n_empty > 0) return 0;
  for (i = 0; i < s->n_blocks && (long)(i + 1) * c->bs <= limit; i++) {
    const kva__block *k = &c->blk[s->table[i]];
    if (!k->published || k->salt != c->blk[s->table[0]].salt) break;
    if (i == 0 ? k->parent != -1 : k->parent != s->table[i - 1] || k->parent_gen != c->blk[s->table[i - 1]].pub_gen)
      break;
  }
  return i;
}

/* Bytes of a stream of len tokens with these sections; SIZE_MAX on overflow. */
static inline size_t kva__stream_size(const kva_cache *c, int len, unsigned flags, int n_prefix) {
  size_t per_token = 0, layers = 0, n = (size_t)len, total;
  int l;
  for (l = 0; l < c->n_layers; l++) {
    per_token += (size_t)c->G * (c->k_row[l] + (c->kind == KVA_CACHE_KV ? c->v_row[l] : 0));
    layers += 16 + 8 * (size_t)c->G;
  }
  if (flags & KVA__STREAM_SPANS) layers += 16 * (size_t)c->n_layers;
  if (flags & KVA__STREAM_POS) per_token += (size_t)c->n_layers * (size_t)c->G * 4;
  if (flags & KVA__STREAM_SCORES) per_token += (size_t)c->n_layers * (size_t)c->G * 4;
  if (n && per_token > ((size_t)-1 - 1024 - layers - 4 * (size_t)n_prefix) / n) return (size_t)-1;
  total = KVA__STREAM_HEADER + layers + 4 * (size_t)n_prefix + per_token * n + 8;
  return total;
}

/* A stream's per-slot fields, in their order per layer and KV head. */
enum { KVA__FIELD_K, KVA__FIELD_V, KVA__FIELD_POS, KVA__FIELD_SCORE };
static inline int kva__stream_has(const kva_cache *c, unsigned flags, int field) {
  return field == KVA__FIELD_K || (field == KVA__FIELD_V && c->kind == KVA_CACHE_KV) ||
         (field == KVA__FIELD_POS && (flags & KVA__STREAM_POS)) ||
         (field == KVA__FIELD_SCORE && (flags & KVA__STREAM_SCORES));
}
static inline unsigned char *kva__field_ptr(const kva_cache *c, int field, int l, int32_t b, int g, int slot) {
  switch (field) {
    case KVA__FIELD_K: return kva__k_ptr(c, l, b, g, slot);
    case KVA__FIELD_V: return kva__v_ptr(c, l, b, g, slot);
    case KVA__FIELD_POS: return (unsigned char *)kva__pos_ptr(c, l, b, g, slot);
    default: return (unsigned char *)kva__score_ptr(c, l, b, g, slot);
  }
}

static inline size_t kva__field_bytes(const kva_cache *c, int field, int l) {
  return field == KVA__FIELD_K ? c->k_row[l] : field == KVA__FIELD_V ? c->v_row[l] : 4;
}

/* One field of head (l, g) over slots [0, len) of a block table, from the
   blocks to the stream at `to`, or (to NULL) from the stream at `from` into
   the blocks, but not into block `hole`; returns the stream bytes. A head's
   slots are contiguous inside a block. */
static inline size_t kva__stream_field(const kva_cache *c, const int32_t *table, int32_t hole, int len, int field,
                                       int l, int g, unsigned char *to, const unsigned char *from) {
  size_t bytes = kva__field_bytes(c, field, l), done = 0;
  int slot, n;
  for (slot = 0; slot < len; slot += n) {
    unsigned char *at = kva__field_ptr(c, field, l, table[slot / c->bs], g, slot % c->bs);
    n = c->bs - slot % c->bs < len - slot ? c->bs - slot % c->bs : len - slot;
    if (to) memcpy(to + done, at, (size_t)n * bytes);
    else if (table[slot / c->bs] != hole) memcpy(at, from + done, (size_t)n * bytes);
    done += (size_t)n * bytes;
  }
  return done;
}

/* A layer's group in a stream: kind, window, n_sink, chunk_size (FULL: zeros). */
static inline void kva__layer_span_record(const kva_cache *c, int l, int32_t *span) {
  const kva__span *sp = c->layer_span[l] >= 0 ? &c->spans[c->layer_span[l]] : NULL;
  span[0] = sp ? sp->kind : KVA_SPAN_FULL;
  span[1] = sp ? sp->window : 0;
  span[2] = sp ? sp->n_sink : 0;
  span[3] = sp ? sp->chunk : 0;
}

static inline unsigned char *kva__put(unsigned char *p, const void *src, size_t n) {
  memcpy(p, src, n);
  return p + n;
}
static inline unsigned char *kva__put_i32(unsigned char *p, int32_t x) { return kva__put(p, &x, 4); }

KVA_API kva_status kva_seq_export(kva_cache *c, int seq, void *buf, size_t cap, size_t *size) {
  const kva__seq *s;
  unsigned flags;
  int l, g, i, n_prefix, unstored;
  size_t need;
  unsigned char *p;
  uint32_t u32;
  uint64_t u64;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !size, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE_WHY(c, s->dm_len > 0, KVA_ERR_UNSUPPORTED, "a stream does not carry a sequence's demoted tokens");
  KVA__REFUSE_WHY(c, s->n_empty > 0, KVA_ERR_UNSUPPORTED, "a stream does not carry empty slots (per-head budgets)");
  flags = (c->block_pos ? KVA__STREAM_POS : 0u) | (c->block_score ? KVA__STREAM_SCORES : 0u) |
          (c->n_spans ? KVA__STREAM_SPANS : 0u) | (unsigned)c->rotate << KVA__STREAM_ROTATE_SHIFT;
  n_prefix = kva__seq_prefix_blocks(c, s) * c->bs;
  need = kva__stream_size(c, s->len, flags, n_prefix);
  KVA__REFUSE(c, need == (size_t)-1, KVA_ERR_NOMEM);
  *size = need;
  if (!buf) return KVA_OK;
  KVA__REFUSE(c, cap < need, KVA_ERR_ARG);
  p = (unsigned char *)buf;
  p = kva__put(p, KVA__STREAM_MAGIC, 8);
  u32 = KVA__STREAM_VERSION, p = kva__put(p, &u32, 4);
  u32 = KVA__STREAM_ORDER, p = kva__put(p, &u32, 4);
  u64 = (uint64_t)need, p = kva__put(p, &u64, 8);
  p = kva__put_i32(p, (int32_t)c->kind);
  p = kva__put_i32(p, c->n_layers);
  p = kva__put_i32(p, c->G);
  p = kva__put_i32(p, c->D);
  p = kva__put_i32(p, c->DV);
  p = kva__put_i32(p, c->bs);
  p = kva__put_i32(p, (int32_t)flags);
  p = kva__put_i32(p, s->len);
  p = kva__put_i32(p, s->pos);
  p = kva__put_i32(p, s->last_append);
  unstored = s->unstored_from;
  p = kva__put_i32(p, unstored >= s->len ? -1 : unstored); /* a slot past the end is none */
  for (i = 0; i < 2; i++) {
    kva_evict none;
    const kva_evict *e = i == 0 ? &s->evict : &s->evict_next;
    memset(&none, 0, sizeof none);
    if (e->kind == KVA_EVICT_SCORE) e = &none; /* a function does not travel */
    p = kva__put_i32(p, e->kind);
    p = kva__put_i32(p, e->budget);
    p = kva__put_i32(p, e->n_sink);
    p = kva__put_i32(p, e->n_recent);
    p = kva__put_i32(p, e->rollback);
  }
  p = kva__put_i32(p, n_prefix);
  p = kva__put_i32(p, 0);
  u64 = n_prefix ? c->blk[s->table[0]].salt : 0, p = kva__put(p, &u64, 8);
  memset(p, 0, (size_t)((unsigned char *)buf + KVA__STREAM_HEADER - p)); /* reserved */
  p = (unsigned char *)buf + KVA__STREAM_HEADER;
  for (l = 0; l < c->n_layers; l++) {
    p = kva__put_i32(p, (int32_t)c->kt[l]);
    p = kva__put_i32(p, (int32_t)c->vt[l]);
    p = kva__put_i32(p, s->stored[2 * l]);
    p = kva__put_i32(p, s->stored[2 * l + 1]);
    p = kva__put(p, c->k_fp8 + (size_t)l * (size_t)c->G, 4 * (size_t)c->G);
    p = kva__put(p, c->v_fp8 + (size_t)l * (size_t)c->G, 4 * (size_t)c->G);
  }
  for (l = 0; l < c->n_layers && c->n_spans; l++) {
    int32_t span[4];
    kva__layer_span_record(c, l, span);
    for (i = 0; i < 4; i++) p = kva__put_i32(p, span[i]);
  }
  for (i = 0; i < n_prefix / c->bs; i++)
    p = kva__put(p, c->blk_tokens + (size_t)s->table[i] * (size_t)c->bs, (size_t)c->bs * 4);
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++)
      for (i = KVA__FIELD_K; i <= KVA__FIELD_SCORE; i++)
        if (kva__stream_has(c, flags, i))
          p += kva__stream_field(c, kva__layer_table(c, s, l), -1, s->len, i, l, g, p, NULL);
  u64 = kva__stream_checksum(buf, need - 8);
  p = kva__put(p, &u64, 8);
  KVATTN_ASSERT(p == (unsigned char *)buf + need);
  return KVA_OK;
}

static inline int32_t kva__get_i32(const unsigned char *p) {
  int32_t x;
  memcpy(&x, p, 4);
  return x;
}

/* The stream's checks that need its data: positions in range and in order
   where the cache relies on it (no eviction: the slot; the step's tokens:
   the newest positions), scores finite and >= 0. */
static inline int kva__stream_rows_ok(const kva_cache *c, const unsigned char *p, int len, int pos, int step,
                                      unsigned flags) {
  int l, g, i, f;
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++)
      for (f = KVA__FIELD_K; f <= KVA__FIELD_SCORE; f++) {
        if (!kva__stream_has(c, flags, f)) continue;
        if (f == KVA__FIELD_POS)
          for (i = 0; i < len; i++) {
            int32_t q = kva__get_i32(p + 4 * (size_t)i);
            if (q < 0 || q >= pos) return 0;
            if ((pos == len || i >= len - step) && q != pos - len + i) return 0;
          }
        if (f == KVA__FIELD_SCORE)
          for (i = 0; i < len; i++) {
            float x;
            memcpy(&x, p + 4 * (size_t)i, 4);
            if (!(x >= 0.0f && x <= FLT_MAX)) return 0;
          }
        p += (size_t)len * kva__field_bytes(c, f, l);
      }
  return 1;
}

/* A new sequence from a kva_seq_export stream. Everything is checked
   before anything changes. */
KVA_API kva_status kva_seq_import(kva_cache *c, const void *buf, size_t size, int *seq) {
  const unsigned char *in = (const unsigned char *)buf, *lay, *rows;
  uint32_t u32;
  uint64_t u64;
  int32_t h[26];
  kva_evict ev[2];
  unsigned flags;
  int i, l, g, len, pos, step, unstored, n_prefix, first_unstored, id;
  size_t layer_bytes;
  kva__seq *s;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !buf || !seq, KVA_ERR_ARG);
  KVA__REFUSE(c, size < KVA__STREAM_HEADER + 8 || memcmp(in, KVA__STREAM_MAGIC, 8) != 0, KVA_ERR_STREAM);
  memcpy(&u32, in + 12, 4);
  KVA__REFUSE(c, u32 == 0x04030201u, KVA_ERR_UNSUPPORTED); /* the other byte order: nothing else reads right */
  KVA__REFUSE(c, u32 != KVA__STREAM_ORDER, KVA_ERR_STREAM);
  memcpy(&u64, in + 16, 8);
  KVA__REFUSE(c, u64 != (uint64_t)size, KVA_ERR_STREAM);
  memcpy(&u64, in + size - 8, 8);
  KVA__REFUSE(c, u64 != kva__stream_checksum(in, size - 8), KVA_ERR_STREAM);
  memcpy(&u32, in + 8, 4);
  KVA__REFUSE(c, u32 != KVA__STREAM_VERSION, KVA_ERR_UNSUPPORTED);
  for (i = 0; i < 26; i++) h[i] = kva__get_i32(in + 24 + 4 * (size_t)i);
  /* h: kind n_layers G D DV bs flags | len pos step unstored | 2 x 5 policy | n_prefix 0 | salt (2 words) | 0 */
  for (i = 24 + 26 * 4; i < KVA__STREAM_HEADER; i++) /* reserved */
    KVA__REFUSE(c, in[i], KVA_ERR_STREAM);
  if (h[0] != (int32_t)c->kind || h[1] != c->n_layers || h[2] != c->G || h[3] != c->D || h[4] != c->DV)
    return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__, "the stream is of another cache shape");
  flags = (unsigned)h[6];
  len = h[7], pos = h[8], step = h[9], unstored = h[10];
  if (h[5] <= 0 || h[6] < 0 || h[6] > 31 || len < 0 || pos < len || step < 0 || step > len || unstored < -1 ||
      h[22] != 0 || h[25] != 0 || unstored >= len || (h[21] == 0 && (h[23] != 0 || h[24] != 0)))
    return kva__refuse(c, KVA_ERR_STREAM, __func__, "the stream's header is inconsistent");
  for (i = 0; i < 2; i++) {
    kva_evict *e = &ev[i];
    memset(e, 0, sizeof *e);
    e->kind = h[11 + 5 * i], e->budget = h[12 + 5 * i], e->n_sink = h[13 + 5 * i];
    e->n_recent = h[14 + 5 * i], e->rollback = h[15 + 5 * i];
    if (kva__evict_check(e) != KVA_OK || (e->kind == KVA_EVICT_NONE && (e->budget || e->n_sink || e->n_recent ||
                                                                        e->rollback)))
      return kva__refuse(c, KVA_ERR_STREAM, __func__, "the stream's eviction policy is invalid");
  }
  /* the layers: types and scales must be this cache's */
  layer_bytes = (size_t)c->n_layers * (16 + 8 * (size_t)c->G + (flags & KVA__STREAM_SPANS ? 16 : 0));
  KVA__REFUSE(c, size - KVA__STREAM_HEADER - 8 < layer_bytes, KVA_ERR_STREAM);
  lay = in + KVA__STREAM_HEADER;
  KVA__REFUSE(c, !(flags & KVA__STREAM_SPANS) != !c->n_spans, KVA_ERR_UNSUPPORTED); /* another layer pattern */
  KVA__REFUSE(c, (int)(flags >> KVA__STREAM_ROTATE_SHIFT) != c->rotate, KVA_ERR_UNSUPPORTED); /* another basis */
  for (l = 0; l < c->n_layers && c->n_spans; l++) {
    int32_t span[4];
    kva__layer_span_record(c, l, span);
    for (i = 0; i < 4; i++)
      if (kva__get_i32(lay + (size_t)c->n_layers * (16 + 8 * (size_t)c->G) + 16 * (size_t)l + 4 * (size_t)i) != span[i])
        return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__, "the stream has another layer-group pattern");
  }
  first_unstored = unstored < 0 ? INT_MAX : unstored;
  for (l = 0; l < c->n_layers; l++) {
    const unsigned char *L = lay + (size_t)l * (16 + 8 * (size_t)c->G);
    int32_t from = kva__get_i32(L + 8), to = kva__get_i32(L + 12), left;
    if (kva__get_i32(L) != (int32_t)c->kt[l] || kva__get_i32(L + 4) != (int32_t)c->vt[l] ||
        memcmp(L + 16, c->k_fp8 + (size_t)l * (size_t)c->G, 4 * (size_t)c->G) != 0 ||
        memcmp(L + 16 + 4 * (size_t)c->G, c->v_fp8 + (size_t)l * (size_t)c->G, 4 * (size_t)c->G) != 0)
      return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__, "the stream has another storage type or FP8 scale");
    KVA__REFUSE(c, from < 0 || to < from || to > step, KVA_ERR_STREAM);
    left = from > 0 ? 0 : to; /* as kva__step_unstored */
    if (left < step && len - step + left < first_unstored) first_unstored = len - step + left;
  }
  n_prefix = h[21];
  if (n_prefix < 0 || n_prefix > len || n_prefix % h[5] != 0 ||
      (n_prefix > 0 && (pos != len || n_prefix > len - step || n_prefix > first_unstored)))
    return kva__refuse(c, KVA_ERR_STREAM, __func__, "the stream's published prefix length is invalid");
  KVA__REFUSE(c, kva__stream_size(c, len, flags, n_prefix) != size, KVA_ERR_STREAM);
  KVA__REFUSE(c, pos != len && !(flags & KVA__STREAM_POS), KVA_ERR_STREAM); /* evicted without positions */
  rows = lay + layer_bytes + 4 * (size_t)n_prefix;
  KVA__REFUSE(c, !kva__stream_rows_ok(c, rows, len, pos, step, flags), KVA_ERR_STREAM);
  for (i = 0; i < c->n_spans; i++) { /* a group holds what the step's queries may see */
    int first = kva__span_first_block(c, &c->spans[i], len - step), sinks = kva__span_sink_blocks(c, &c->spans[i]);
    int n_blocks = kva__blocks_for(c, len), held;
    if (first > n_blocks) first = n_blocks;
    held = n_blocks - (first > sinks ? first - sinks : 0);
    KVA__REFUSE(c, held > kva__span_avail(&c->spans[i]), KVA_ERR_FULL);
  }
  /* what this cache must keep for it */
  for (i = 0; i < 2; i++)
    if ((ev[i].kind == KVA_EVICT_H2O && c->evict_support != KVA_EVICT_SUPPORT_ALL) ||
        (ev[i].kind == KVA_EVICT_WINDOW && c->evict_support == KVA_EVICT_SUPPORT_NONE))
      return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__,
                         "the stream's eviction policy needs scores / positions this cache does not keep");
  KVA__REFUSE(c, pos != len && !c->block_pos, KVA_ERR_UNSUPPORTED); /* evicted: positions are not the slots */
  KVA__REFUSE_WHY(c, kva__blocks_for(c, len) > c->max_table || kva__blocks_for(c, len) > c->n_free + c->n_cached,
                  KVA_ERR_FULL, "too few free blocks for the stream's tokens");
  s = kva__seq_alloc(c, &id);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ_LIMIT, __func__, "max_seqs sequences are live");

  /* commit */
  while (s->n_blocks < kva__blocks_for(c, len)) s->table[s->n_blocks++] = kva__block_take(c);
  for (i = 0; i < c->n_spans; i++) {
    kva__span *sp = &c->spans[i];
    int first = kva__span_first_block(c, sp, len - step), sinks = kva__span_sink_blocks(c, sp), b;
    int32_t *t = kva__span_table(c, s, i);
    for (b = 0; b < s->n_blocks; b++) t[b] = b < sinks || b >= first ? kva__span_take(sp) : kva__span_hole(sp);
    s->span_from[i] = first > sinks ? first : sinks;
  }
  for (l = 0; l < c->n_layers; l++)
    for (g = 0; g < c->G; g++) {
      int f;
      for (f = KVA__FIELD_K; f <= KVA__FIELD_SCORE; f++) {
        if (kva__stream_has(c, flags, f)) { /* the stream has it; the cache may not keep it */
          int keeps = f <= KVA__FIELD_V || (f == KVA__FIELD_POS ? c->block_pos != NULL : c->block_score != NULL);
          int32_t hole = c->layer_span[l] >= 0 ? kva__span_hole(&c->spans[c->layer_span[l]]) : -1;
          rows += keeps ? kva__stream_field(c, kva__layer_table(c, s, l), hole, len, f, l, g, NULL, rows)
                        : (size_t)len * 4;
        } else if (f == KVA__FIELD_POS && c->block_pos) {
          for (i = 0; i < len; i++) *kva__pos_ptr(c, l, s->table[i / c->bs], g, i % c->bs) = i;
        } else if (f == KVA__FIELD_SCORE && c->block_score) {
          for (i = 0; i < len; i++) *kva__score_ptr(c, l, s->table[i / c->bs], g, i % c->bs) = 0.0f;
        }
      }
    }
  s->len = len;
  s->pos = pos;
  s->last_append = step;
  s->unstored_from = unstored < 0 ? INT_MAX : unstored;
  s->evict = ev[0];
  s->evict_next = ev[1];
  for (l = 0; l < c->n_layers; l++) {
    const unsigned char *L = lay + (size_t)l * (16 + 8 * (size_t)c->G);
    s->stored[2 * l] = kva__get_i32(L + 8);
    s->stored[2 * l + 1] = kva__get_i32(L + 12);
    if (c->block_bounds) kva__bounds_rebuild(c, s, l); /* from the rows, not from the stream */
  }
  if (n_prefix >= c->bs) { /* its prefix-cache blocks: known here too from now on */
    memcpy(&u64, in + 24 + 23 * 4, 8); /* the salt */
    memcpy(c->victims, lay + layer_bytes, 4 * (size_t)n_prefix); /* aligned token ids */
    kva__publish_blocks(c, s, c->victims, n_prefix / c->bs, u64);
  }
  *seq = id;
  return KVA_OK;
}

/* ======================================================================
   [9] cache store / attend / read (rotation first), batched attention
   ====================================================================== */

/* --- rotation (kva_cache_desc.rotate) --- */

/* A row of n values in the rotated basis and back (the transform is its own
   inverse): whole for a power of two up to 1024, else per group of 32. */
static inline void kva__rotate_row(float *x, int n) {
  int g;
  if (n <= 1024 && (n & (n - 1)) == 0) {
    kva__fwht(x, n);
    return;
  }
  for (g = 0; g + 32 <= n; g += 32) kva__fwht(x + g, 32);
}
/* Rows t < n_q, heads h < H of width w at x + t * stride + h * w, rotated in place. */
static inline void kva__rotate_rows(float *x, int n_q, int H, int w, size_t stride) {
  int t, h;
  for (t = 0; t < n_q; t++)
    for (h = 0; h < H; h++) kva__rotate_row(x + (size_t)t * stride + (size_t)h * (size_t)w, w);
}
/* The query rows of an item's rows [row0, row0 + nrows) of KV head g (row r:
   query r / R, head g * R + r % R) in out, rotated back in place. */
static inline void kva__rotate_item(const kva__attn_params *P, float *out, int g, int row0, int nrows) {
  int r;
  for (r = row0; r < row0 + nrows; r++)
    kva__rotate_row(out + (size_t)(r / P->R) * P->o_stride + (size_t)(g * P->R + r % P->R) * (size_t)P->DV, P->DV);
}
#define KVA__ROTATE_STACK 4096 /* floats of rotated queries on the stack: a decode step of 32 heads of 128 */
/* a row of n values as the cache stores it: src, or (rotated) its rotation in tmp */
static inline const float *kva__as_stored(const float *src, int n, int rotated, float *tmp) {
  if (!rotated) return src;
  memcpy(tmp, src, (size_t)n * sizeof(float));
  kva__rotate_row(tmp, n);
  return tmp;
}

/* Write K (and V) of n_tokens of the step's newest tokens of `layer`, from
   the step's token `offset` on. Token t's heads [n_kv_heads][head_dim] start
   at k + t * k_stride (v + t * v_stride: [n_kv_heads][v_dim]; NULL for
   LATENT); a stride 0 means packed rows. */
KVA_API kva_status kva_store_strided(kva_cache *c, int seq, int layer, int offset, const float *k, int k_stride,
                                     const float *v, int v_stride, int n_tokens) {
  kva__seq *s;
  int32_t *done;
  int t, g;
  size_t ks, vs;
  float stack_row[1024], *tmp = NULL;
  size_t row_bytes;
  kva__heap heap;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, layer < 0 || layer >= c->n_layers || n_tokens < 0 || offset < 0, KVA_ERR_ARG);
  row_bytes = (size_t)(c->D > c->DV ? c->D : c->DV) * sizeof(float);
  KVA__REFUSE(c, n_tokens > 0 && (!k || (c->kind == KVA_CACHE_KV && !v)), KVA_ERR_ARG);
  KVA__REFUSE(c, k_stride < 0 || v_stride < 0, KVA_ERR_ARG);
  KVA__REFUSE(c, (k_stride && k_stride < c->G * c->D) || (v_stride && v_stride < c->G * c->DV), KVA_ERR_ARG);
  ks = k_stride ? (size_t)k_stride : (size_t)c->G * (size_t)c->D;
  vs = v_stride ? (size_t)v_stride : (size_t)c->G * (size_t)c->DV;
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if (n_tokens == 0) return KVA_OK;
  KVA__REFUSE(c, n_tokens > s->last_append || offset > s->last_append - n_tokens, KVA_ERR_STEP);
  done = s->stored + 2 * layer; /* what is stored stays one range: this chunk must touch it */
  KVA__REFUSE(c, done[1] > done[0] && (offset > done[1] || offset + n_tokens < done[0]), KVA_ERR_ARG);
  heap.alloc_fn = c->alloc_fn, heap.free_fn = c->free_fn, heap.user = c->user;
  if (c->rotate) { /* a row at a time, rotated first */
    tmp = row_bytes <= sizeof stack_row ? stack_row : (float *)kva__heap_take(&heap, row_bytes);
    KVA__REFUSE(c, !tmp, KVA_ERR_NOMEM);
  }
  for (t = 0; t < n_tokens; t++) {
    int slot = s->len - s->last_append + offset + t, in_block;
    int32_t b = kva__slot_block(c, s, layer, slot, &in_block);
    for (g = 0; g < c->G; g++) {
      const float *kr = k + (size_t)t * ks + (size_t)g * (size_t)c->D;
      kva__store_row(c->kt[layer], kva__k_ptr(c, layer, b, g, in_block),
                     kva__as_stored(kr, c->D, c->rotate & KVA_ROTATE_K, tmp), c->D,
                     c->k_fp8[(size_t)layer * (size_t)c->G + (size_t)g]);
      if (c->block_bounds) kva__bounds_add(c, layer, b, g, in_block);
      if (c->kind == KVA_CACHE_KV)
        kva__store_row(c->vt[layer], kva__v_ptr(c, layer, b, g, in_block),
                       kva__as_stored(v + (size_t)t * vs + (size_t)g * (size_t)c->DV, c->DV,
                                      c->rotate & KVA_ROTATE_V, tmp),
                       c->DV, c->v_fp8[(size_t)layer * (size_t)c->G + (size_t)g]);
    }
  }
  if (tmp && tmp != stack_row) kva__heap_give(&heap, tmp, row_bytes);
  if (done[1] <= done[0]) {
    done[0] = offset;
    done[1] = offset + n_tokens;
  } else {
    if (offset < done[0]) done[0] = offset;
    if (offset + n_tokens > done[1]) done[1] = offset + n_tokens;
  }
  return KVA_OK;
}

/* kva_store_strided with packed rows:
   k [n_tokens][n_kv_heads][head_dim], v [n_tokens][n_kv_heads][v_dim] (NULL for LATENT). */
KVA_API kva_status kva_store_at(kva_cache *c, int seq, int layer, int offset, const float *k, const float *v,
                                int n_tokens) {
  return kva_store_strided(c, seq, layer, offset, k, 0, v, 0, n_tokens);
}

/* Write K (and V) of the newest n_tokens slots of `layer`. */
KVA_API kva_status kva_store(kva_cache *c, int seq, int layer, const float *k, const float *v, int n_tokens) {
  const kva__seq *s = kva__seq_get(c, seq);
  int offset = s && n_tokens >= 0 && n_tokens <= s->last_append ? s->last_append - n_tokens : 0;
  return kva_store_at(c, seq, layer, offset, k, v, n_tokens);
}


/* Would storing the step's newest n tokens complete `layer`'s step? (A layer
   forward stores them, then attends: it checks this first, to fail before
   changing anything.) */
static inline int kva__store_completes(const kva__seq *s, int layer, int n) {
  const int32_t *done = s->stored + 2 * layer;
  return n == s->last_append || (done[1] > done[0] && done[0] == 0 && done[1] >= s->last_append - n);
}

/* A WINDOW / CHUNK group's layer attends within its span: the call may
   narrow it (a window and sinks no larger, any chunk on a WINDOW group, a
   window on a CHUNK group) but not see more; without its own, the group's. */
static inline kva_status kva__layer_span_params(const kva_cache *c, int layer, kva__attn_params *P) {
  const kva__span *sp;
  if (c->layer_span[layer] < 0) return KVA_OK;
  sp = &c->spans[c->layer_span[layer]];
  if (sp->kind == KVA_SPAN_WINDOW) {
    if (P->window == 0) {
      if (P->n_sink > sp->n_sink) return KVA_ERR_ARG;
      P->window = sp->window;
      P->n_sink = sp->n_sink;
    } else if (P->window > sp->window || P->n_sink > sp->n_sink) {
      return KVA_ERR_ARG;
    }
  } else {
    if (P->chunk != 0 && P->chunk != sp->chunk) return KVA_ERR_ARG;
    P->chunk = sp->chunk;
  }
  return KVA_OK;
}

static inline void kva__cache_view(const kva_cache *c, const kva__seq *s, int layer, kva__kv_view *w) {
  memset(w, 0, sizeof *w);
  w->paged = 1;
  w->pos_max = (int32_t)(s->pos - 1); /* positions are given out in order, from s->pos on */
  w->kt = c->kt[layer];
  w->vt = c->kind == KVA_CACHE_KV ? c->vt[layer] : c->kt[layer];
  w->k_code_off = kva__code_offset(w->kt);
  w->v_code_off = kva__code_offset(w->vt);
  w->k_fp8_scale = c->k_fp8 + (size_t)layer * (size_t)c->G;
  w->v_fp8_scale = c->v_fp8 + (size_t)layer * (size_t)c->G;
  w->pool = c->pool[layer];
  w->block_bytes = c->layer_block[layer];
  w->v_off = c->v_off[layer];
  w->k_row = c->k_row[layer];
  w->v_row = c->v_row[layer];
  w->table = kva__layer_table(c, s, layer);
  w->slots_are_positions = s->pos == s->len && s->n_empty == 0; /* nothing evicted */
  w->has_empty = s->n_empty > 0;
  if (w->has_empty) w->pos_max = KVA_POS_EMPTY;
  w->block_pos = c->block_pos ? c->block_pos + (size_t)layer * (size_t)c->n_blocks * (size_t)c->G * (size_t)c->bs : NULL;
  w->block_size = c->bs;
  w->n_kv_heads = c->G;
  w->bounds = c->block_bounds ? kva__bounds_ptr(c, layer, 0, 0) : NULL;
  if (kva__accumulates(&s->evict)) /* attention adds to the scores; the append made every block private */
    w->key_scores = c->block_score + (size_t)layer * (size_t)c->n_blocks * (size_t)c->G * (size_t)c->bs;
}

/* --- block selection (kva_attn.select_budget) ---
   Per query token and KV head, among the blocks it can see (by the window,
   its sinks and the chunk, when a block's index gives its positions): the
   blocks holding the first select_sink and the last select_recent tokens
   are read; of the others, the budget left (select_budget minus the tokens
   of those, in whole blocks: floor(left / block_size) of them) goes to the
   blocks with the largest bound max over the group's query heads h of
   kva__block_bound(q_h, block's bounds), a larger bound first and, between
   equal ones, the earlier block (a bound that is not a number counts as
   +Inf). The blocks read are walked in order, as the unselected pass walks
   them all. */
#define KVA__SELECT_MAX_BLOCKS 2048 /* blocks one selection may read: stack arrays */
#define KVA__SELECT_AHEAD 16         /* blocks whose bounds are prefetched ahead of the one ranked */

/* Does a call reading len tokens select? */
static inline int kva__selects(const kva__attn_params *P, int len) { return P->select_budget > 0 && len > P->select_budget; }
/* Why the fields cannot select on this cache (NULL: they can): the stack arrays' limit */
static inline const char *kva__select_span_rule(const kva_cache *c, const kva__attn_params *P) {
  long blocks = ((long)P->select_sink + c->bs - 1) / c->bs + P->select_budget / c->bs +
                ((long)P->select_recent + c->bs - 1) / c->bs + 1;
  return P->select_budget > 0 && blocks > KVA__SELECT_MAX_BLOCKS
             ? "select_sink, select_budget and select_recent span more than 2,048 blocks"
             : NULL;
}
/* Why sequence s cannot select (NULL: it can): KVA_ERR_UNSUPPORTED */
static inline const char *kva__select_seq_rule(const kva_cache *c, const kva__seq *s, int tree) {
  if (!c->block_bounds) return "a->select_budget needs a cache that keeps block bounds (kva_cache_desc.block_bounds)";
  if (tree || kva__accumulates(&s->evict))
    return "block selection does not combine with tree attention or accumulated attention (H2O, accumulate)";
  return NULL;
}
/* Can a query at position p see any of the keys at positions [first, end)?
   Within p's chunk, one query's range is a tile's: exact. */
static inline int kva__range_seen(const kva__attn_params *P, int32_t p, int64_t first, int64_t end) {
  if (P->chunk > 0) {
    int64_t chunk_first = kva__chunk_of(P, p) * P->chunk;
    if (first < chunk_first) first = chunk_first;
    if (end > chunk_first + P->chunk) end = chunk_first + P->chunk;
  }
  return first < end && !kva__tile_none_visible(P, p, p, (int32_t)first, (int32_t)(end - 1));
}
/* Does block a (bound ba) rank before block b (bound bb)? */
static inline int kva__select_before(float ba, int32_t a, float bb, int32_t b) { return ba > bb || (ba == bb && a < b); }
/* Restore the heap below i: the root is the worst kept block. */
static inline void kva__select_sift(float *hb, int32_t *hi, int n, int i) {
  for (;;) {
    int w = i, l = 2 * i + 1, r = l + 1;
    float tb;
    int32_t ti;
    if (l < n && kva__select_before(hb[w], hi[w], hb[l], hi[l])) w = l;
    if (r < n && kva__select_before(hb[w], hi[w], hb[r], hi[r])) w = r;
    if (w == i) return;
    tb = hb[i], hb[i] = hb[w], hb[w] = tb;
    ti = hi[i], hi[i] = hi[w], hi[w] = ti;
    i = w;
  }
}
static int kva__int32_cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}
/* The blocks one query token (q: its [H][D] row, position qpos) reads of
   KV head g, of the first n held tokens (those up to its own, causal): their
   indices in the sequence's table, ascending, into sel; returns how many. */
static inline int kva__select_blocks(const kva__kv_view *w, int n, int32_t qpos, const kva__attn_params *P,
                                     const float *q, int g, int32_t *sel) {
  const int bs = w->block_size, nb = (n + bs - 1) / bs;
  const int32_t *table = w->table;
  const size_t head_bounds = 2 * (size_t)P->D, block_bounds = (size_t)w->n_kv_heads * head_bounds;
  /* past a window or chunk, blocks of positions the row cannot see are neither ranked nor counted */
  const int masked = w->slots_are_positions && (P->window > 0 || P->chunk > 0);
  float hb[KVA__SELECT_MAX_BLOCKS];
  int32_t hi[KVA__SELECT_MAX_BLOCKS];
  int sink_end = (int)(((long)P->select_sink + bs - 1) / bs), recent_begin, i, r, k, kept = 0, count = 0;
  long forced = 0, seen = 0, candidates = 0, left;
#define KVA__BLOCK_HELD(i) ((i) == nb - 1 ? n - (i) * bs : bs)
#define KVA__BLOCK_SEEN(i) (!masked || kva__range_seen(P, qpos, (int64_t)(i) * bs, (int64_t)(i) * bs + KVA__BLOCK_HELD(i)))
  if (sink_end > nb) sink_end = nb;
  recent_begin = P->select_recent >= n ? 0 : (n - P->select_recent) / bs;
  if (P->select_recent == 0) recent_begin = nb;
  if (recent_begin < sink_end) recent_begin = sink_end;
  for (i = 0; i < nb; i++) {
    long held = KVA__BLOCK_SEEN(i) ? KVA__BLOCK_HELD(i) : 0;
    seen += held;
    if (i < sink_end || i >= recent_begin) forced += held;
    else candidates += held > 0;
  }
  if (seen <= P->select_budget) { /* all of them */
    for (i = 0; i < nb; i++)
      if (KVA__BLOCK_SEEN(i)) sel[count++] = i;
    return count;
  }
  left = P->select_budget - forced;
  k = left > 0 ? (int)(left / bs) : 0;
  if (k > candidates) k = (int)candidates;
  for (i = sink_end; i < recent_begin && k > 0; i++) {
    const uint16_t *lohi = w->bounds + (size_t)table[i] * block_bounds + (size_t)g * head_bounds;
    float bound = -INFINITY;
    if (!KVA__BLOCK_SEEN(i)) continue;
    /* blocks sit anywhere in the pool: without this each one's bounds are a
       cache miss, which cost more than the bound's arithmetic */
    if (i + KVA__SELECT_AHEAD < recent_begin)
      kva__prefetch_span(w->bounds + (size_t)table[i + KVA__SELECT_AHEAD] * block_bounds + (size_t)g * head_bounds,
                         4 * (size_t)P->D);
    /* a block where the head holds no token (its slots empty) has no bound: chosen last, if at all */
    for (r = w->has_empty && kva__bounds_empty(lohi, P->D) ? P->R : 0; r < P->R; r += 4) { /* four query heads per pass */
      const float *qr[4];
      float b[4];
      int nr = P->R - r < 4 ? P->R - r : 4, t;
      for (t = 0; t < nr; t++) qr[t] = q + (size_t)(g * P->R + r + t) * (size_t)P->D;
      kva__block_bound(qr, nr, lohi, P->D, b);
      for (t = 0; t < nr; t++) {
        if (b[t] != b[t]) b[t] = INFINITY;
        if (b[t] > bound) bound = b[t];
      }
    }
    if (kept < k) { /* fill, then keep the heap's root the worst */
      hb[kept] = bound, hi[kept] = i, kept++;
      if (kept == k)
        for (r = k / 2 - 1; r >= 0; r--) kva__select_sift(hb, hi, k, r);
    } else if (kva__select_before(bound, i, hb[0], hi[0])) {
      hb[0] = bound, hi[0] = i;
      kva__select_sift(hb, hi, k, 0);
    }
  }
  for (i = 0; i < sink_end; i++)
    if (KVA__BLOCK_SEEN(i)) sel[count++] = i;
  qsort(hi, (size_t)kept, sizeof hi[0], kva__int32_cmp);
  for (i = 0; i < kept; i++) sel[count++] = hi[i];
  for (i = recent_begin; i < nb; i++)
    if (KVA__BLOCK_SEEN(i)) sel[count++] = i;
  return count;
#undef KVA__BLOCK_HELD
#undef KVA__BLOCK_SEEN
}

/* Query token i (of the newest n_q of a sequence holding len tokens) and
   KV head g over the blocks kva__select_blocks picks: one pass over a view
   of those blocks only (positions from block_pos, or from each block's
   index). out / lse: the call's rows, as kva__attend_all's. */
static inline void kva__attend_selected_one(const kva__attn_params *P, const kva__kv_view *w, int len, int n_q, int i,
                                            int g, const float *q, int32_t q_base, float *out, float *lse) {
  int32_t sel[KVA__SELECT_MAX_BLOCKS], phys[KVA__SELECT_MAX_BLOCKS]; /* sel: block indices, then first positions */
  /* a causal query token sees the tokens up to its own */
  const int bs = w->block_size, n = P->non_causal ? len : len - n_q + i + 1, nb = (n + bs - 1) / bs;
  int k, nsel, n_read;
  kva__kv_view ws = *w;
  kva__pass ps;
  nsel = kva__select_blocks(w, n, q_base + i, P, q + (size_t)i * P->q_stride, g, sel);
  n_read = nsel == 0 ? 0 : (nsel - 1) * bs + (sel[nsel - 1] == nb - 1 ? n - (nb - 1) * bs : bs);
  for (k = 0; k < nsel; k++) {
    phys[k] = w->table[sel[k]];
    sel[k] *= bs;
  }
  ws.table = phys;
  ws.sel_first = w->block_pos ? NULL : sel;
  ws.slots_are_positions = 0;
  ps = kva__pass_base(P, &ws, q, NULL, q_base);
  kva__pass_rows(&ps, 0, n_read, g, 1, i * P->R, P->R);
  ps.out = out, ps.lse = lse;
  kva__attend_rows(&ps);
}
/* Every query token and KV head of a cache call that selects */
static inline void kva__attend_selected(const kva__attn_params *P, const kva__kv_view *w, int len, const float *q,
                                        int n_q, int32_t q_base, float *out, float *lse, int n_threads) {
  int items = n_q * P->G, it, nt = kva__threads(n_threads);
  if (nt > items) nt = items;
  (void)nt;
  KVA__OMP_FOR(nt)
  for (it = 0; it < items; it++) kva__attend_selected_one(P, w, len, n_q, it / P->G, it % P->G, q, q_base, out, lse);
}

/* The demoted region of s in `layer` as keys (kva_evict.demote_dtype): its
   ring's slots, each with its position, none selected or scored. */
static inline void kva__demoted_view(const kva_cache *c, const kva__seq *s, int layer, kva__kv_view *w) {
  memset(w, 0, sizeof *w);
  w->paged = 1;
  w->pos_max = (int32_t)(s->pos - 1);
  w->kt = w->vt = c->dt;
  w->k_code_off = w->v_code_off = kva__code_offset(c->dt);
  w->pool = c->dm_pool + (size_t)layer * (size_t)c->dm_blocks * c->dm_block;
  w->block_bytes = c->dm_block;
  w->v_off = c->dm_v_off;
  w->k_row = c->dm_k_row;
  w->v_row = c->dm_v_row;
  w->table = s->dm_table;
  w->block_pos = c->dm_pos + (size_t)layer * (size_t)c->dm_blocks * (size_t)c->G * (size_t)c->bs;
  w->block_size = c->bs;
  w->n_kv_heads = c->G;
}
#define KVA__DEMOTE_STACK 4608 /* floats: a decode step's demoted rows up to n_heads x (v_dim + 2) of that */

/* kva_attend_cache, and with lse non-NULL also each row's log-sum-exp [n_q][n_heads] */
KVA_API kva_status kva_attend_cache_lse(kva_cache *c, int seq, int layer, const kva_attn *a, const float *q, int n_q,
                                        float *out, float *lse) {
  kva__attn_params P;
  const char *why;
  kva__kv_view w;
  kva__seq *s;
  int selecting;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, layer < 0 || layer >= c->n_layers || n_q < 0, KVA_ERR_ARG);
  if (kva__attn_resolve(a, &P, &why) != KVA_OK) return kva__refuse(c, KVA_ERR_ARG, __func__, why);
  KVA__REFUSE_WHY(c, P.G != c->G, KVA_ERR_ARG, "a->n_kv_heads differs from the cache's n_kv_heads");
  KVA__REFUSE_WHY(c, P.D != c->D, KVA_ERR_ARG, "a->head_dim differs from the cache's head_dim");
  KVA__REFUSE_WHY(c, P.DV != c->DV, KVA_ERR_ARG, "a->v_dim differs from the cache's v_dim");
  KVA__REFUSE_WHY(c, kva__layer_span_params(c, layer, &P) != KVA_OK, KVA_ERR_ARG,
                  "the layer's WINDOW / CHUNK group does not hold what a->window, n_sink or chunk_size ask for");
  KVA__REFUSE(c, n_q > 0 && (!q || !out), KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if (n_q == 0) return KVA_OK;
  KVA__REFUSE(c, n_q > s->last_append, KVA_ERR_STEP);
  KVA__REFUSE(c, a->tree_parent && kva__tree_check(a->tree_parent, n_q) != KVA_OK, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, !kva__step_stored(s, layer), KVA_ERR_NOT_STORED,
                  "the step's tokens are not all stored in this layer: kva_store them before attending");
  selecting = kva__selects(&P, s->len);
  if (selecting && (why = kva__select_seq_rule(c, s, a->tree_parent != NULL)) != NULL)
    return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__, why);
  if (selecting && (why = kva__select_span_rule(c, &P)) != NULL) return kva__refuse(c, KVA_ERR_ARG, __func__, why);
  kva__cache_view(c, s, layer, &w);
  w.tree_parent = a->tree_parent;
  w.tree_base = (int32_t)(s->pos - n_q);
  w.tree_n = n_q;
  {
    float scratch[KVA__STACK_SCRATCH]; /* per call: other threads may attend this cache meanwhile */
    float rq_stack[KVA__ROTATE_STACK], *rq = NULL;
    size_t rq_floats = (size_t)n_q * (size_t)P.H * (size_t)P.D;
    /* a demoted region: its rows [n_q][H][DV] and lse, and the held rows' lse if the caller takes none */
    float dm_stack[KVA__DEMOTE_STACK], *dm = NULL;
    size_t rows = (size_t)n_q * (size_t)P.H, dm_floats = s->dm_len > 0 ? rows * ((size_t)P.DV + 1 + !lse) : 0;
    kva__heap from_cache;
    from_cache.alloc_fn = c->alloc_fn;
    from_cache.free_fn = c->free_fn;
    from_cache.user = c->user;
    if (dm_floats) { /* taken first: a refusal must come before attention adds to H2O scores */
      dm = dm_floats <= KVA__DEMOTE_STACK ? dm_stack : (float *)kva__heap_take(&from_cache, dm_floats * sizeof(float));
      KVA__REFUSE_WHY(c, !dm, KVA_ERR_NOMEM, "no memory for the demoted region's rows");
    }
    if (c->rotate & KVA_ROTATE_K) { /* the queries in the keys' basis, packed */
      int t;
      rq = rq_floats <= KVA__ROTATE_STACK ? rq_stack : (float *)kva__heap_take(&from_cache, rq_floats * sizeof(float));
      if (!rq && dm != dm_stack) kva__heap_give(&from_cache, dm, dm_floats * sizeof(float));
      KVA__REFUSE(c, !rq, KVA_ERR_NOMEM);
      for (t = 0; t < n_q; t++)
        memcpy(rq + (size_t)t * (size_t)P.H * (size_t)P.D, q + (size_t)t * P.q_stride,
               (size_t)P.H * (size_t)P.D * sizeof(float));
      kva__rotate_rows(rq, n_q, P.H, P.D, (size_t)P.H * (size_t)P.D);
      q = rq;
      P.q_stride = (size_t)P.H * (size_t)P.D;
    }
    {
      float *held_lse = dm && !lse ? dm + rows * ((size_t)P.DV + 1) : lse;
      if (selecting)
        kva__attend_selected(&P, &w, s->len, q, n_q, (int32_t)(s->pos - n_q), out, held_lse, a->n_threads);
      else
        kva__attend_all(&P, &w, s->len, q, n_q, NULL, (int32_t)(s->pos - n_q), out, held_lse, a->n_threads, scratch,
                        KVA__STACK_SCRATCH, n_q > 1 ? &from_cache : NULL);
      if (dm) { /* the demoted keys by the same masks (no sink logits: they joined once), then one softmax */
        kva__attn_params Pd = P;
        kva__kv_view wd;
        float *dm_lse = dm + rows * (size_t)P.DV;
        size_t r;
        Pd.sinks = NULL;
        Pd.select_budget = 0;
        Pd.o_stride = (size_t)P.H * (size_t)P.DV;
        kva__demoted_view(c, s, layer, &wd);
        wd.tree_parent = w.tree_parent; /* the queries sit where the tree puts them (no demoted key is a node) */
        wd.tree_base = w.tree_base;
        wd.tree_n = w.tree_n;
        kva__attend_all(&Pd, &wd, s->dm_len, q, n_q, NULL, (int32_t)(s->pos - n_q), dm, dm_lse, a->n_threads,
                        scratch, KVA__STACK_SCRATCH, n_q > 1 ? &from_cache : NULL);
        for (r = 0; r < rows; r++) {
          float *o = out + r / (size_t)P.H * P.o_stride + r % (size_t)P.H * (size_t)P.DV;
          const float *parts[2];
          float lses[2];
          parts[0] = o, parts[1] = dm + r * (size_t)P.DV;
          lses[0] = held_lse[r], lses[1] = dm_lse[r];
          held_lse[r] = kva__merge_row(o, parts, lses, 2, P.DV);
        }
        if (dm != dm_stack) kva__heap_give(&from_cache, dm, dm_floats * sizeof(float));
      }
    }
    if (rq && rq != rq_stack) kva__heap_give(&from_cache, rq, rq_floats * sizeof(float));
    if (c->rotate & KVA_ROTATE_V) kva__rotate_rows(out, n_q, P.H, P.DV, P.o_stride); /* back from V's basis */
  }
  return KVA_OK;
}

/* Attention of the newest n_q tokens (q [n_q][n_heads][head_dim]) over the
   sequence's cached keys of `layer`, reading the blocks in place. */
KVA_API kva_status kva_attend_cache(kva_cache *c, int seq, int layer, const kva_attn *a, const float *q, int n_q,
                                    float *out) {
  return kva_attend_cache_lse(c, seq, layer, a, q, n_q, out, NULL);
}

/* Batched attention (continuous batching): one call attends the newest
   n_q[i] tokens of each of n_seqs sequences over their cached keys of one
   layer. kva_batch_plan splits the work once per step (sequences x KV heads
   x row chunks, and long key ranges into split-K parts when there are few
   of those) and allocates every buffer; kva_attend_batch then runs it for
   each layer without allocating. q is [sum n_q][n_heads][head_dim] and out
   [sum n_q][n_heads][v_dim], the sequences' rows one after another in plan
   order. A plan holds for the sequence lengths it saw: after the next
   append, plan again (KVA_ERR_ARG otherwise). One plan runs one call at a
   time; within it, an engine's threads may share the units and then the
   merges (kva_batch_prepare, kva_batch_run_units, kva_batch_run_merges). */
typedef struct {
  int32_t seq;    /* index into the plan's sequences */
  int32_t g, row0, n_chunks; /* KV head; rows row0 .. in n_chunks chunks of KVA__MAXROWS */
  int32_t kv0, kv1;
  int32_t part;   /* split-K partial result slot, or -1: write the output directly */
  int32_t demoted; /* 1: over the sequence's demoted region (one more part of the merge) */
} kva__unit;

struct kva_batch {
  kva__attn_params P;
  kva__attn_params layer_P;        /* the prepared layer's: P within its group's span */
  int n_threads, n_seqs, n_units, n_merges, splits_max;
  int layer;                       /* the prepared layer, -1: none (kva_batch_prepare) */
  const float *q;                  /* the prepared layer's rows */
  float *out, *lse;
  int *seq_id, *n_q, *len, *pos, *evict_kind, *q_row; /* per sequence; q_row: first query row in q / out */
  int *dm_len;                     /* per sequence: its demoted tokens when planned */
  kva__kv_view *dm_views;          /* per sequence with demoted tokens, rebuilt by each run */
  int32_t *tree_parent;            /* NULL, or [sum n_q]: each sequence's tree (kva_attn.tree_parent) */
  float *sinks;                    /* NULL, or [n_heads]: the plan's copy of kva_attn.sink_logits */
  int rotate;                      /* the cache's kva_cache_desc.rotate when planned */
  float *rotated_q;                /* rotate & KVA_ROTATE_K: [sum n_q][n_heads][head_dim] the prepared q, rotated */
  int *merge_unit;                 /* per merged item: its first unit (its parts follow) */
  int *merge_splits;
  kva__unit *units;
  kva__kv_view *views;             /* per sequence, rebuilt by each run */
  float *parts;                    /* n_parts x KVA__MAXROWS x (DV + 1) */
  size_t bytes;                    /* the plan's one block, from its cache's allocator: */
  void (*free_fn)(void *p, size_t size, void *user); /* NULL: KVATTN_FREE */
  void *user;
};

KVA_API void kva_batch_free(kva_batch *b) {
  if (!b) return;
  if (b->free_fn) b->free_fn(b, b->bytes, b->user);
  else KVATTN_FREE(b);
}

/* Sequence i's work units (and split parts and merges) from *u, *pi, *mi
   on; with b NULL, only the counters advance (the plan's sizing pass). */
static inline void kva__plan_seq(kva_batch *b, const kva__attn_params *P, const kva__seq *s, int i, int n_q,
                                 int items_total, int *u, int *pi, int *mi) {
  int chunks = (n_q * P->R + KVA__MAXROWS - 1) / KVA__MAXROWS, h2o = kva__accumulates(&s->evict), g, ch, k;
  int S = kva__kv_splits(items_total, s->len, h2o);
  const int selects = kva__selects(P, s->len), dm = s->dm_len > 0;
  if (dm && S >= KVA__MAXSPLIT) S = KVA__MAXSPLIT - 1; /* the demoted region is one more part */
  for (g = 0; g < P->G && chunks > 0; g++) {
    if (h2o || selects) { /* one unit per KV head: its chunks add to the same key scores; or it selects */
      kva__unit un = {0, 0, 0, 0, 0, 0, -1, 0};
      un.seq = i; un.g = g; un.n_chunks = chunks; un.kv1 = s->len;
      if (b) b->units[*u] = un;
      ++*u;
      continue;
    }
    for (ch = 0; ch < chunks; ch++) {
      if (S + dm > 1) {
        if (b) {
          b->merge_unit[*mi] = *u;
          b->merge_splits[*mi] = S + dm;
        }
        ++*mi;
      }
      for (k = 0; k < S + dm; k++) {
        kva__unit un = {0, 0, 0, 1, 0, 0, -1, 0};
        un.seq = i; un.g = g; un.row0 = ch * KVA__MAXROWS;
        if (k < S) kva__split_range(s->len, S, k, &un.kv0, &un.kv1);
        else un.demoted = 1, un.kv0 = 0, un.kv1 = s->dm_len;
        if (S + dm > 1) un.part = (*pi)++;
        if (b) b->units[*u] = un;
        ++*u;
      }
    }
  }
}

/* A plan's one block: the struct, then its per-sequence, per-unit and
   per-merge arrays and the split-K partials. */
static inline void kva__batch_layout(kva__layout *L, kva_batch *b, int n_seqs, int n_units, int n_merges,
                                     size_t part_floats, size_t tree_nodes, size_t sinks, size_t q_floats) {
  size_t seqs = (size_t)n_seqs, merges = (size_t)n_merges;
  kva__carve(L, 1, sizeof(kva_batch));
  b->views = (kva__kv_view *)kva__carve(L, seqs, sizeof(kva__kv_view));
  b->units = (kva__unit *)kva__carve(L, (size_t)n_units, sizeof(kva__unit));
  b->seq_id = (int *)kva__carve(L, seqs, sizeof(int));
  b->n_q = (int *)kva__carve(L, seqs, sizeof(int));
  b->len = (int *)kva__carve(L, seqs, sizeof(int));
  b->pos = (int *)kva__carve(L, seqs, sizeof(int));
  b->evict_kind = (int *)kva__carve(L, seqs, sizeof(int));
  b->q_row = (int *)kva__carve(L, seqs, sizeof(int));
  b->dm_len = (int *)kva__carve(L, seqs, sizeof(int));
  b->dm_views = (kva__kv_view *)kva__carve(L, seqs, sizeof(kva__kv_view));
  b->merge_unit = (int *)kva__carve(L, merges, sizeof(int));
  b->merge_splits = (int *)kva__carve(L, merges, sizeof(int));
  b->parts = (float *)kva__carve(L, part_floats, sizeof(float));
  b->tree_parent = tree_nodes ? (int32_t *)kva__carve(L, tree_nodes, sizeof(int32_t)) : NULL;
  b->sinks = sinks ? (float *)kva__carve(L, sinks, sizeof(float)) : NULL;
  b->rotated_q = q_floats ? (float *)kva__carve(L, q_floats, sizeof(float)) : NULL;
}

/* A plan for the step, built in `old`'s block when it is large enough (old
   NULL: always a new block); *out only on success. */
static inline kva_status kva__batch_build(kva_cache *c, const kva_attn *a, const int *seqs, const int *n_q,
                                          int n_seqs, kva_batch *old, kva_batch **out) {
  kva__attn_params P;
  kva__layout L;
  const char *why;
  size_t part = 0, q_floats;
  int i, n_units = 0, n_parts = 0, n_merges = 0, items_total = 0, rows_total = 0, u, pi, mi;
  unsigned char *mem;
  kva_batch *b, sizing, block;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, n_seqs < 0 || (n_seqs > 0 && (!seqs || !n_q)), KVA_ERR_ARG);
  if (kva__attn_resolve(a, &P, &why) != KVA_OK) return kva__refuse(c, KVA_ERR_ARG, __func__, why);
  if ((why = kva__select_span_rule(c, &P)) != NULL) return kva__refuse(c, KVA_ERR_ARG, __func__, why);
  KVA__REFUSE_WHY(c, P.G != c->G, KVA_ERR_ARG, "a->n_kv_heads differs from the cache's n_kv_heads");
  KVA__REFUSE_WHY(c, P.D != c->D, KVA_ERR_ARG, "a->head_dim differs from the cache's head_dim");
  KVA__REFUSE_WHY(c, P.DV != c->DV, KVA_ERR_ARG, "a->v_dim differs from the cache's v_dim");
  for (i = 0; i < n_seqs; i++) { /* validate, and count the items */
    const kva__seq *s = kva__seq_get(c, seqs[i]);
    int rows, chunks;
    if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
    KVA__REFUSE(c, n_q[i] < 0, KVA_ERR_ARG);
    KVA__REFUSE(c, n_q[i] > s->last_append, KVA_ERR_STEP);
    KVA__REFUSE(c, (int64_t)rows_total + n_q[i] > INT_MAX / P.H, KVA_ERR_ARG);
    KVA__REFUSE(c, a->tree_parent && kva__tree_check(a->tree_parent + rows_total, n_q[i]) != KVA_OK, KVA_ERR_ARG);
    if (kva__selects(&P, s->len) && (why = kva__select_seq_rule(c, s, a->tree_parent != NULL)) != NULL)
      return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__, why); /* as kva_attend_cache */
    KVA__REFUSE_WHY(c, s->dm_len > 0 && (kva__selects(&P, s->len) || kva__accumulates(&s->evict)),
                    KVA_ERR_UNSUPPORTED,
                    "a sequence holds demoted tokens and selects or accumulates: attend it with kva_attend_cache");
    rows_total += n_q[i];
    rows = n_q[i] * P.R;
    chunks = (rows + KVA__MAXROWS - 1) / KVA__MAXROWS;
    items_total += kva__accumulates(&s->evict) ? (chunks > 0 ? P.G : 0) : P.G * chunks;
  }
  for (i = 0; i < n_seqs; i++) /* count units, split parts and merges */
    kva__plan_seq(NULL, &P, kva__seq_get(c, seqs[i]), i, n_q[i], items_total, &n_units, &n_parts, &n_merges);
  part = (size_t)KVA__MAXROWS * ((size_t)P.DV + 1);
  L.base = NULL, L.size = 0, L.overflow = 0;
  q_floats = c->rotate & KVA_ROTATE_K ? (size_t)rows_total * (size_t)P.H * (size_t)P.D : 0;
  kva__batch_layout(&L, &sizing, n_seqs, n_units, n_merges, (size_t)n_parts * part,
                    a->tree_parent ? (size_t)rows_total : 0, a->sink_logits ? (size_t)P.H : 0, q_floats);
  KVA__REFUSE(c, L.overflow, KVA_ERR_NOMEM);
  if (old && L.size <= old->bytes) { /* rebuild in place: the block keeps its size and owner */
    block = *old;
    mem = (unsigned char *)old;
  } else {
    mem = (unsigned char *)(c->alloc_fn ? c->alloc_fn(L.size, 64, c->user) : KVATTN_MALLOC(L.size));
    KVA__REFUSE(c, !mem, KVA_ERR_NOMEM);
    block.bytes = L.size;
    block.free_fn = c->alloc_fn ? c->free_fn : NULL;
    block.user = c->user;
    if (old) kva_batch_free(old);
  }
  b = (kva_batch *)mem;
  memset(b, 0, sizeof *b);
  L.base = mem, L.size = 0;
  kva__batch_layout(&L, b, n_seqs, n_units, n_merges, (size_t)n_parts * part,
                    a->tree_parent ? (size_t)rows_total : 0, a->sink_logits ? (size_t)P.H : 0, q_floats);
  if (a->tree_parent && rows_total > 0) /* the plan keeps its own copy: the caller's may change */
    memcpy(b->tree_parent, a->tree_parent, (size_t)rows_total * sizeof(int32_t));
  b->bytes = block.bytes;
  b->free_fn = block.free_fn;
  b->user = block.user;
  b->P = P;
  if (b->sinks) { /* the plan keeps its own copy, as of the tree */
    memcpy(b->sinks, a->sink_logits, (size_t)P.H * sizeof(float));
    b->P.sinks = b->sinks;
  }
  b->n_threads = a->n_threads;
  b->rotate = c->rotate;
  b->n_seqs = n_seqs;
  b->n_units = n_units;
  b->n_merges = n_merges;
  b->layer = -1;
  u = pi = mi = 0;
  rows_total = 0;
  for (i = 0; i < n_seqs; i++) {
    const kva__seq *s = kva__seq_get(c, seqs[i]);
    b->seq_id[i] = seqs[i];
    b->n_q[i] = n_q[i];
    b->len[i] = s->len;
    b->pos[i] = s->pos;
    b->evict_kind[i] = kva__accumulates(&s->evict) ? KVA_EVICT_H2O : (int)s->evict.kind;
    b->dm_len[i] = s->dm_len;
    b->q_row[i] = rows_total;
    rows_total += n_q[i];
    kva__plan_seq(b, &P, s, i, n_q[i], items_total, &u, &pi, &mi);
  }
  KVATTN_ASSERT(u == n_units && pi == n_parts && mi == n_merges);
  *out = b;
  return KVA_OK;
}

KVA_API kva_status kva_batch_plan(kva_cache *c, const kva_attn *a, const int *seqs, const int *n_q, int n_seqs,
                                  kva_batch **plan) {
  KVA__REFUSE(c, !plan, KVA_ERR_ARG);
  *plan = NULL;
  return kva__batch_build(c, a, seqs, n_q, n_seqs, NULL, plan);
}

/* The next step's plan in *plan's block when it fits (no allocation), else in
   a new block (the old one freed); *plan NULL: as kva_batch_plan. On error
   *plan is left as it was, still valid. */
KVA_API kva_status kva_batch_replan(kva_cache *c, const kva_attn *a, const int *seqs, const int *n_q, int n_seqs,
                                    kva_batch **plan) {
  KVA__REFUSE(c, !plan, KVA_ERR_ARG);
  return kva__batch_build(c, a, seqs, n_q, n_seqs, *plan, plan);
}

/* Binds a plan to one layer's run: checks that the plan still matches the
   cache, builds the sequences' views and remembers q, out and lse. Until the
   next prepare, kva_batch_run_units / kva_batch_run_merges run this layer.
   On error the plan is left unprepared. */
KVA_API kva_status kva_batch_prepare(kva_cache *c, kva_batch *b, int layer, const float *q, float *out, float *lse) {
  const kva__attn_params *P;
  int i;
  if (b) b->layer = -1;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !b || layer < 0 || layer >= c->n_layers, KVA_ERR_ARG);
  P = &b->P;
  KVA__REFUSE(c, P->G != c->G || P->D != c->D || P->DV != c->DV, KVA_ERR_ARG);
  b->layer_P = *P;
  KVA__REFUSE_WHY(c, kva__layer_span_params(c, layer, &b->layer_P) != KVA_OK, KVA_ERR_ARG,
                  "the layer's WINDOW / CHUNK group does not hold what a->window, n_sink or chunk_size ask for");
  KVA__REFUSE(c, b->rotate != c->rotate, KVA_ERR_ARG);
  KVA__REFUSE(c, b->n_units > 0 && (!q || !out), KVA_ERR_ARG);
  for (i = 0; i < b->n_seqs; i++) { /* a stale plan: the sequence moved on (argument errors first) */
    const kva__seq *s = kva__seq_get(c, b->seq_id[i]);
    if (s && (s->len != b->len[i] || s->pos != b->pos[i] || s->dm_len != b->dm_len[i] || (kva__accumulates(&s->evict) ? KVA_EVICT_H2O : (int)s->evict.kind) != b->evict_kind[i] ||
              b->n_q[i] > s->last_append))
      return kva__refuse(c, KVA_ERR_ARG, __func__, "a sequence changed since the plan was made: plan again");
  }
  for (i = 0; i < b->n_seqs; i++)
    KVA__REFUSE_WHY(c, !kva__seq_get(c, b->seq_id[i]), KVA_ERR_SEQ, "a sequence of the plan was freed");
  for (i = 0; i < b->n_seqs; i++)
    KVA__REFUSE(c, b->n_q[i] > 0 && !kva__step_stored(kva__seq_get(c, b->seq_id[i]), layer), KVA_ERR_NOT_STORED);
  for (i = 0; i < b->n_seqs; i++) {
    const kva__seq *s = kva__seq_get(c, b->seq_id[i]);
    kva__cache_view(c, s, layer, &b->views[i]);
    b->views[i].tree_parent = b->tree_parent ? b->tree_parent + b->q_row[i] : NULL;
    b->views[i].tree_base = (int32_t)(b->pos[i] - b->n_q[i]);
    b->views[i].tree_n = b->n_q[i];
    if (s->dm_len > 0) { /* its queries where the tree puts them, as over the held keys */
      kva__demoted_view(c, s, layer, &b->dm_views[i]);
      b->dm_views[i].tree_parent = b->views[i].tree_parent;
      b->dm_views[i].tree_base = b->views[i].tree_base;
      b->dm_views[i].tree_n = b->views[i].tree_n;
    }
  }
  b->layer = layer;
  b->q = q, b->out = out, b->lse = lse;
  if (b->rotated_q) { /* the queries in the keys' basis, packed */
    int rows = b->n_seqs > 0 ? b->q_row[b->n_seqs - 1] + b->n_q[b->n_seqs - 1] : 0, t;
    for (t = 0; t < rows; t++)
      memcpy(b->rotated_q + (size_t)t * (size_t)P->H * (size_t)P->D, q + (size_t)t * P->q_stride,
             (size_t)P->H * (size_t)P->D * sizeof(float));
    kva__rotate_rows(b->rotated_q, rows, P->H, P->D, (size_t)P->H * (size_t)P->D);
    b->q = b->rotated_q;
    b->layer_P.q_stride = (size_t)P->H * (size_t)P->D;
  }
  return KVA_OK;
}

KVA_API int kva_batch_n_units(const kva_batch *b) { return b ? b->n_units : 0; }
KVA_API int kva_batch_n_merges(const kva_batch *b) { return b ? b->n_merges : 0; }

/* Runs work units [begin, end) of the prepared layer. Distinct ranges may run
   at the same time from any threads; every unit once, then the merges. */
KVA_API kva_status kva_batch_run_units(kva_batch *b, int begin, int end) {
  const kva__attn_params *P;
  size_t part;
  int u;
  if (!b || b->layer < 0 || begin < 0 || end < begin || end > b->n_units) return KVA_ERR_ARG;
  P = &b->layer_P;
  part = (size_t)KVA__MAXROWS * ((size_t)P->DV + 1);
  for (u = begin; u < end; u++) {
    const kva__unit *un = &b->units[u];
    int rows = b->n_q[un->seq] * P->R, k;
    const float *qs = b->q + (size_t)b->q_row[un->seq] * P->q_stride;
    float *os = b->out + (size_t)b->q_row[un->seq] * P->o_stride;
    float *ls = b->lse ? b->lse + (size_t)b->q_row[un->seq] * (size_t)P->H : NULL;
    const kva__kv_view *w = un->demoted ? &b->dm_views[un->seq] : &b->views[un->seq];
    kva__pass ps = kva__pass_base(P, w, qs, NULL, (int32_t)(b->pos[un->seq] - b->n_q[un->seq]));
    if (kva__selects(P, b->len[un->seq])) { /* token by token, as kva_attend_cache */
      for (k = 0; k < b->n_q[un->seq]; k++) {
        kva__attend_selected_one(P, &b->views[un->seq], b->len[un->seq], b->n_q[un->seq], k, un->g, qs,
                                 (int32_t)(b->pos[un->seq] - b->n_q[un->seq]), os, ls);
        if (b->rotate & KVA_ROTATE_V) kva__rotate_item(P, os, un->g, k * P->R, P->R); /* back from V's basis */
      }
      continue;
    }
    for (k = 0; k < un->n_chunks; k++) {
      int c0 = un->row0 + k * KVA__MAXROWS, nrows = rows - c0 < KVA__MAXROWS ? rows - c0 : KVA__MAXROWS;
      kva__pass_rows(&ps, un->kv0, un->kv1, un->g, 1, c0, nrows);
      if (un->part < 0) {
        ps.out = os, ps.lse = ls;
        kva__attend_rows(&ps);
        if (b->rotate & KVA_ROTATE_V) kva__rotate_item(P, os, un->g, c0, nrows); /* back from V's basis */
      } else {
        ps.out = b->parts + (size_t)un->part * part;
        ps.lse = ps.out + (size_t)KVA__MAXROWS * (size_t)P->DV;
        ps.compact = 1;
        kva__attend_rows(&ps);
      }
    }
  }
  return KVA_OK;
}

/* Merges [begin, end) of the prepared layer's split-K results into out (and
   lse), after every unit has run; distinct ranges may run at the same time. */
KVA_API kva_status kva_batch_run_merges(kva_batch *b, int begin, int end) {
  const kva__attn_params *P;
  size_t part;
  int i;
  if (!b || b->layer < 0 || begin < 0 || end < begin || end > b->n_merges) return KVA_ERR_ARG;
  P = &b->layer_P;
  part = (size_t)KVA__MAXROWS * ((size_t)P->DV + 1);
  for (i = begin; i < end; i++) { /* a merge's parts are consecutive */
    const kva__unit *un = &b->units[b->merge_unit[i]];
    int rows = b->n_q[un->seq] * P->R;
    kva__merge_item(P, un->g, un->row0, rows - un->row0 < KVA__MAXROWS ? rows - un->row0 : KVA__MAXROWS,
                    b->parts + (size_t)un->part * part, part, KVA__MAXROWS, b->merge_splits[i],
                    b->out + (size_t)b->q_row[un->seq] * P->o_stride,
                    b->lse ? b->lse + (size_t)b->q_row[un->seq] * (size_t)P->H : NULL);
    if (b->rotate & KVA_ROTATE_V) /* back from V's basis */
      kva__rotate_item(P, b->out + (size_t)b->q_row[un->seq] * P->o_stride, un->g, un->row0,
                       rows - un->row0 < KVA__MAXROWS ? rows - un->row0 : KVA__MAXROWS);
  }
  return KVA_OK;
}

/* kva_attend_batch, and with lse non-NULL also each row's log-sum-exp, [rows][n_heads] in q's row order */
KVA_API kva_status kva_attend_batch_lse(kva_cache *c, kva_batch *b, int layer, const float *q, float *out,
                                        float *lse) {
  int i, u, nt;
  kva_status st = kva_batch_prepare(c, b, layer, q, out, lse);
  if (st != KVA_OK) return st;
  nt = kva__threads(b->n_threads);
  if (nt > b->n_units) nt = b->n_units;
  (void)nt;
  KVA__OMP_FOR(nt)
  for (u = 0; u < b->n_units; u++) (void)kva_batch_run_units(b, u, u + 1);
  nt = kva__threads(b->n_threads);
  if (nt > b->n_merges) nt = b->n_merges;
  KVA__OMP_FOR(nt)
  for (i = 0; i < b->n_merges; i++) (void)kva_batch_run_merges(b, i, i + 1);
  return KVA_OK;
}

KVA_API kva_status kva_attend_batch(kva_cache *c, kva_batch *b, int layer, const float *q, float *out) {
  return kva_attend_batch_lse(c, b, layer, q, out, NULL);
}

/* A dequantized copy of slot `slot`: k [n_kv_heads][head_dim], v [n_kv_heads][v_dim],
   pos [n_kv_heads]; any output may be NULL. */
KVA_API kva_status kva_seq_read(const kva_cache *c, int seq, int layer, int slot, float *k, float *v,
                                int32_t *pos) {
  const kva__seq *s;
  int g, in_block;
  int32_t b;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, layer < 0 || layer >= c->n_layers || slot < 0, KVA_ERR_ARG);
  KVA__REFUSE(c, c->kind == KVA_CACHE_LATENT && v, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE(c, slot >= s->len, KVA_ERR_ARG);
  b = kva__slot_block(c, s, layer, slot, &in_block);
  if (c->layer_span[layer] >= 0 && b == kva__span_hole(&c->spans[c->layer_span[layer]]))
    return kva__refuse(c, KVA_ERR_UNSUPPORTED, __func__,
                       "the layer's WINDOW / CHUNK group released that token (no query can see it)");
  for (g = 0; g < c->G; g++) {
    const size_t at = (size_t)layer * (size_t)c->G + (size_t)g;
    kva__read_head(c, c->kt[layer], c->vt[layer], kva__k_ptr(c, layer, b, g, in_block),
                   v ? kva__v_ptr(c, layer, b, g, in_block) : NULL, c->k_fp8[at], c->v_fp8[at],
                   k ? k + (size_t)g * (size_t)c->D : NULL, v ? v + (size_t)g * (size_t)c->DV : NULL);
    if (pos) pos[g] = c->block_pos ? *kva__pos_ptr(c, layer, b, g, in_block) : (int32_t)slot;
  }
  return KVA_OK;
}

/* Tokens in the sequence's demoted region (kva_evict.demote_dtype); -1: no such sequence. */
KVA_API int kva_seq_demoted(const kva_cache *c, int seq) {
  const kva__seq *s = kva__seq_get(c, seq);
  return s ? s->dm_len : -1;
}

/* A dequantized copy of slot `slot` (0 .. kva_seq_demoted - 1, in no
   particular order) of the demoted region, as kva_seq_read gives a held one. */
KVA_API kva_status kva_seq_read_demoted(const kva_cache *c, int seq, int layer, int slot, float *k, float *v,
                                        int32_t *pos) {
  const kva__seq *s;
  int g, in_block;
  int32_t b;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, layer < 0 || layer >= c->n_layers || slot < 0, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  KVA__REFUSE_WHY(c, slot >= s->dm_len, KVA_ERR_ARG, "slot >= kva_seq_demoted: no demoted token there");
  b = s->dm_table[slot / c->bs];
  in_block = slot % c->bs;
  for (g = 0; g < c->G; g++) {
    kva__read_head(c, c->dt, c->dt, kva__dm_k_ptr(c, layer, b, g, in_block), kva__dm_v_ptr(c, layer, b, g, in_block),
                   1.0f, 1.0f, k ? k + (size_t)g * (size_t)c->D : NULL, v ? v + (size_t)g * (size_t)c->DV : NULL);
    if (pos) pos[g] = *kva__dm_pos_ptr(c, layer, b, g, in_block);
  }
  return KVA_OK;
}

/* ======================================================================
   [10] layers: GQA forward (MHA: G == H, MQA: G == 1)
   ====================================================================== */


/* y [n][n_out] = x [n][n_in] . W^T (+ b); W is [n_out][n_in] (nn.Linear). */
static inline void kva__linear(const float *x, int n, int n_in, const float *w, const float *b, int n_out, float *y,
                               int n_threads) {
  int o, nt = kva__threads(n_threads);
  (void)nt;
  KVA__OMP_FOR(nt)
  for (o = 0; o < n_out; o++) {
    const float *wo = w + (size_t)o * (size_t)n_in;
    float bias = b ? b[o] : 0.0f;
    int t;
    for (t = 0; t < n; t++)
      y[(size_t)t * (size_t)n_out + (size_t)o] = kva__dot_f32(x + (size_t)t * (size_t)n_in, wo, n_in) + bias;
  }
}

/* Temporaries of a layer forward: the caller's workspace when it is large
   enough, else the cache's allocator (alloc_fn, or KVATTN_MALLOC), so an
   engine that gives either sees every byte the call uses. */
static inline void *kva__tmp_take(kva_cache *c, void *ws, size_t ws_bytes, size_t bytes, int *owned) {
  *owned = !(ws && ws_bytes >= bytes);
  if (!*owned) return ws;
  return c->alloc_fn ? c->alloc_fn(bytes, 64, c->user) : KVATTN_MALLOC(bytes);
}

static inline void kva__tmp_give(kva_cache *c, void *p, size_t bytes, int owned) {
  if (!owned || !p) return;
  if (c->free_fn) c->free_fn(p, bytes, c->user);
  else KVATTN_FREE(p);
}

/* q, k, v, the attention output and the positions of n_tokens tokens */
KVA_API size_t kva_gqa_workspace_bytes(const kva_gqa_layer *L, int n_tokens) {
  size_t n, hd, gd;
  if (!L || n_tokens < 0 || L->attn.n_heads <= 0 || L->attn.n_kv_heads <= 0 || L->attn.head_dim <= 0) return 0;
  n = (size_t)n_tokens;
  hd = (size_t)L->attn.n_heads * (size_t)L->attn.head_dim;
  gd = (size_t)L->attn.n_kv_heads * (size_t)L->attn.head_dim;
  return (2 * n * hd + 2 * n * gd) * sizeof(float) + n * sizeof(int32_t);
}

/* Project, RoPE at the absolute positions, store, attend causally over the
   cache, project out. Call kva_seq_append(c, seq, n_tokens) first. */
KVA_API kva_status kva_gqa_forward(const kva_gqa_layer *L, kva_cache *c, int seq, int layer, const float *x,
                                   int n_tokens, float *y) {
  kva__attn_params P;
  const char *why;
  kva__seq *s;
  float *q, *k, *v, *att;
  int32_t *pos;
  int t, dim = 0, nt, owned;
  size_t nq, nkv, bytes;
  kva_status st;
  if (!L || !c) return KVA_ERR_ARG;
  KVA__REFUSE(c, layer < 0 || layer >= c->n_layers || n_tokens < 0 || L->d_model <= 0, KVA_ERR_ARG);
  KVA__REFUSE(c, ((uintptr_t)L->workspace & (sizeof(float) - 1)) != 0, KVA_ERR_ARG);
  if (kva__attn_resolve(&L->attn, &P, &why) != KVA_OK) return kva__refuse(c, KVA_ERR_ARG, __func__, why);
  KVA__REFUSE(c, L->attn.v_dim != 0, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, P.G != c->G, KVA_ERR_ARG, "attn.n_kv_heads differs from the cache's n_kv_heads");
  KVA__REFUSE_WHY(c, P.D != c->D, KVA_ERR_ARG, "attn.head_dim differs from the cache's head_dim");
  KVA__REFUSE(c, P.DV != c->DV || c->kind != KVA_CACHE_KV, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, kva__layer_span_params(c, layer, &P) != KVA_OK, KVA_ERR_ARG,
                  "the layer's WINDOW / CHUNK group does not hold what attn.window, n_sink or chunk_size ask for");
  KVA__REFUSE_WHY(c, kva__rope_check(&L->rope, P.D, &dim) != KVA_OK, KVA_ERR_ARG, "the layer's kva_rope is invalid");
  KVA__REFUSE(c, !L->wq || !L->wk || !L->wv || !L->wo, KVA_ERR_ARG);
  KVA__REFUSE(c, n_tokens > 0 && (!x || !y), KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if (n_tokens == 0) return KVA_OK;
  KVA__REFUSE(c, n_tokens > s->last_append, KVA_ERR_STEP);
  KVA__REFUSE(c, L->attn.tree_parent && kva__tree_check(L->attn.tree_parent, n_tokens) != KVA_OK, KVA_ERR_ARG);
  KVA__REFUSE_WHY(c, !kva__store_completes(s, layer, n_tokens), KVA_ERR_NOT_STORED,
                  "an earlier part of the step is not stored in this layer");

  nq = (size_t)n_tokens * (size_t)P.H * (size_t)P.D;
  nkv = (size_t)n_tokens * (size_t)P.G * (size_t)P.D;
  bytes = kva_gqa_workspace_bytes(L, n_tokens);
  q = (float *)kva__tmp_take(c, L->workspace, L->workspace_bytes, bytes, &owned);
  KVA__REFUSE(c, !q, KVA_ERR_NOMEM);
  k = q + nq;
  v = k + nkv;
  att = v + nkv;
  pos = (int32_t *)(att + nq);
  nt = L->attn.n_threads;
  kva__linear(x, n_tokens, L->d_model, L->wq, L->bq, P.H * P.D, q, nt);
  kva__linear(x, n_tokens, L->d_model, L->wk, L->bk, P.G * P.D, k, nt);
  kva__linear(x, n_tokens, L->d_model, L->wv, L->bv, P.G * P.D, v, nt);
  for (t = 0; t < n_tokens; t++) /* a tree's node sits at the first new position + its depth */
    pos[t] = (int32_t)(s->pos - n_tokens) + (L->attn.tree_parent ? kva__tree_depth(L->attn.tree_parent, t) : t);
  kva_rope_apply(&L->rope, q, n_tokens, P.H, P.D, pos);
  kva_rope_apply(&L->rope, k, n_tokens, P.G, P.D, pos);
  st = kva_store(c, seq, layer, k, v, n_tokens);
  if (st == KVA_OK) {
    kva_attn packed = L->attn; /* the layer's own buffers are packed, whatever strides L->attn names */
    packed.q_stride = packed.out_stride = packed.k_stride = packed.v_stride = 0;
    st = kva_attend_cache(c, seq, layer, &packed, q, n_tokens, att);
  }
  if (st == KVA_OK) kva__linear(att, n_tokens, P.H * P.D, L->wo, L->bo, L->d_model, y, nt);
  kva__tmp_give(c, q, bytes, owned);
  return st;
}


/* ======================================================================
   [10b] layers: MLA (DeepSeek-V2/V3 multi-head latent attention)
   The cache is KVA_CACHE_LATENT, n_kv_heads 1, head_dim d_latent + d_rope,
   v_dim d_latent: per token the RMS-normalised latent c_kv followed by the
   shared, rotated rope key k_pe. Absorbed attention (the default) is MQA
   over that cache with queries [W_UK[h]^T q_nope[h] | q_pe[h]]; the naive
   path rebuilds every head's K and V from the latents (the reference, and
   the cheaper form for long prefill chunks). d_rope 0 without w_kr is the
   common simplified sketch of MLA (c = W_dkv x, K = W_uk c, V = W_uv c, and
   a k_rope computed but never used): no position information at all.
   ====================================================================== */


/* x [n][dim] <- x / sqrt(mean(x^2) + eps) * gain (gain NULL: 1) */
static inline void kva__rmsnorm(float *x, int n, int dim, const float *gain, float eps) {
  int t, i;
  for (t = 0; t < n; t++) {
    float *r = x + (size_t)t * (size_t)dim;
    double ss = 0.0;
    float inv;
    for (i = 0; i < dim; i++) ss += (double)r[i] * (double)r[i];
    inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (i = 0; i < dim; i++) r[i] = r[i] * inv * (gain ? gain[i] : 1.0f);
  }
}

static inline kva_status kva__mla_check(const kva_mla_layer *L, const kva_cache *c, int layer) {
  int dim = 0;
  if (!L || !c || layer < 0 || layer >= c->n_layers) return KVA_ERR_ARG;
  if (L->d_model <= 0 || L->n_heads <= 0 || L->d_latent <= 0 || L->d_nope <= 0 || L->d_rope < 0 || L->d_v <= 0 ||
      L->q_lora_rank < 0 || L->n_threads < 0 || L->norm_eps < 0.0f || L->int_scores < 0 || L->int_scores > 1 ||
      L->int_values < 0 || L->int_values > 1)
    return KVA_ERR_ARG;
  if (L->n_heads > (1 << 16) || L->d_latent > (1 << 16) || L->d_nope > (1 << 16) || L->d_rope > (1 << 16) ||
      L->d_v > (1 << 16))
    return KVA_ERR_ARG;
  if (!(L->scale >= -FLT_MAX && L->scale <= FLT_MAX)) return KVA_ERR_ARG;
  if (L->q_lora_rank ? (!L->wq_a || !L->wq_b) : !L->wq) return KVA_ERR_ARG;
  if (!L->w_dkv || !L->w_uk || !L->w_uv || !L->wo || (L->d_rope > 0 && !L->w_kr)) return KVA_ERR_ARG;
  if (L->d_rope > 0 && kva__rope_check(&L->rope, L->d_rope, &dim) != KVA_OK) return KVA_ERR_ARG;
  /* d_rope 0: nothing rotates, whatever the rope description says */
  if (c->kind != KVA_CACHE_LATENT || c->G != 1 || c->D != L->d_latent + L->d_rope || c->DV != L->d_latent)
    return KVA_ERR_ARG;
  return KVA_OK;
}

/* kva_mla_forward's temporaries for n new tokens of a sequence that then
   holds len tokens. Widths: a head's query is d_nope + d_rope values (no
   position part, then the rotated part), a latent row d_latent + d_rope. */
typedef struct {
  float *q;        /* [n][H][d_nope + d_rope] the queries */
  float *latent;   /* [n][d_latent + d_rope] the new latent rows (c_kv | k_pe) */
  float *q_lora;   /* [n][q_lora_rank] compressed queries (q_lora_rank > 0) */
  float *q_absorbed; /* absorbed: [n][H][d_latent + d_rope] the queries against the latent cache */
  float *o_latent; /* absorbed: [n][H][d_latent] attention output, before W_UV */
  float *o;        /* [n][H][d_v] the heads' outputs */
  float *K, *V;    /* naive: [len][H][d_nope + d_rope], [len][H][d_v] every head's rebuilt K and V */
  float *row;      /* naive: [d_latent + d_rope] one latent row read back */
  float *lse;      /* naive: [n][H] */
  int32_t *pos;    /* [n] the new tokens' positions */
  int32_t *kpos;   /* naive: [len] the keys' positions */
} kva__mla_scratch;
static inline void kva__mla_layout(kva__layout *Lo, kva__mla_scratch *w, const kva_mla_layer *L, size_t n,
                                   size_t len) {
  size_t H = (size_t)L->n_heads, q_width = (size_t)(L->d_nope + L->d_rope);
  size_t latent_width = (size_t)(L->d_latent + L->d_rope);
  memset(w, 0, sizeof *w);
  w->q = (float *)kva__carve(Lo, n * H * q_width, sizeof(float));
  w->latent = (float *)kva__carve(Lo, n * latent_width, sizeof(float));
  w->q_lora = (float *)kva__carve(Lo, n * (size_t)L->q_lora_rank, sizeof(float));
  w->o = (float *)kva__carve(Lo, n * H * (size_t)L->d_v, sizeof(float));
  w->pos = (int32_t *)kva__carve(Lo, n, sizeof(int32_t));
  if (!L->naive) {
    w->q_absorbed = (float *)kva__carve(Lo, n * H * latent_width, sizeof(float));
    w->o_latent = (float *)kva__carve(Lo, n * H * (size_t)L->d_latent, sizeof(float));
  } else {
    w->K = (float *)kva__carve(Lo, len * H * q_width, sizeof(float));
    w->V = (float *)kva__carve(Lo, len * H * (size_t)L->d_v, sizeof(float));
    w->row = (float *)kva__carve(Lo, latent_width, sizeof(float));
    w->lse = (float *)kva__carve(Lo, n * H, sizeof(float));
    w->kpos = (int32_t *)kva__carve(Lo, len, sizeof(int32_t));
  }
}

KVA_API size_t kva_mla_workspace_bytes(const kva_mla_layer *L, int n_tokens, int seq_len) {
  kva__layout Lo = {NULL, 0, 0};
  kva__mla_scratch w;
  if (!L || n_tokens < 0 || seq_len < 0 || L->n_heads <= 0 || L->d_latent <= 0 || L->d_nope <= 0 || L->d_rope < 0 ||
      L->d_v <= 0 || L->q_lora_rank < 0)
    return 0;
  kva__mla_layout(&Lo, &w, L, (size_t)n_tokens, (size_t)seq_len);
  return Lo.overflow ? 0 : Lo.size;
}

/* Absorbed decode: each head's query is turned into the latent space
   (q_lat[h] = W_UK[h]^T q_nope[h], then its rope part), attends the latent
   cache as one MQA head group (K = the whole row, V = its c_kv prefix), and
   W_UV[h] turns the result into the head's output. b_uk shifts all scores
   of a row equally: it cancels. */
static inline kva_status kva__mla_attend_absorbed(const kva_mla_layer *L, kva_cache *c, int seq, int layer,
                                                  int n_tokens, float scale, const kva__mla_scratch *w) {
  int H = L->n_heads, d_latent = L->d_latent, d_nope = L->d_nope, d_rope = L->d_rope, d_v = L->d_v;
  int q_width = d_nope + d_rope, latent_width = d_latent + d_rope, t, h, i, j;
  kva_attn a;
  kva_status st;
  for (t = 0; t < n_tokens; t++)
    for (h = 0; h < H; h++) {
      const float *qn = w->q + ((size_t)t * (size_t)H + (size_t)h) * (size_t)q_width;
      float *qo = w->q_absorbed + ((size_t)t * (size_t)H + (size_t)h) * (size_t)latent_width;
      memset(qo, 0, (size_t)d_latent * sizeof(float));
      for (i = 0; i < d_nope; i++) {
        const float *uk = L->w_uk + ((size_t)h * (size_t)d_nope + (size_t)i) * (size_t)d_latent;
        float qi = qn[i];
        for (j = 0; j < d_latent; j++) qo[j] += qi * uk[j];
      }
      memcpy(qo + d_latent, qn + d_nope, (size_t)d_rope * sizeof(float));
    }
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = 1; a.head_dim = latent_width; a.v_dim = d_latent; a.scale = scale;
  a.n_threads = L->n_threads;
  a.int_scores = L->int_scores;
  a.int_values = L->int_values;
  st = kva_attend_cache(c, seq, layer, &a, w->q_absorbed, n_tokens, w->o_latent);
  /* o[h] = W_UV[h] . (sum_t p c_t) + b_uv[h] */
  for (t = 0; st == KVA_OK && t < n_tokens; t++)
    for (h = 0; h < H; h++)
      kva__linear(w->o_latent + ((size_t)t * (size_t)H + (size_t)h) * (size_t)d_latent, 1, d_latent,
                  L->w_uv + (size_t)h * (size_t)d_v * (size_t)d_latent,
                  L->b_uv ? L->b_uv + (size_t)h * (size_t)d_v : NULL, d_v,
                  w->o + ((size_t)t * (size_t)H + (size_t)h) * (size_t)d_v, 1);
  return st;
}

/* Naive (the reference path): rebuild every head's K [len][H][nope | rope]
   and V [len][H][d_v] from the cached latents and attend them as MHA. With
   H2O eviction it adds to each latent slot's score what the absorbed
   path's kernel would add. */
static inline kva_status kva__mla_attend_naive(const kva_mla_layer *L, kva_cache *c, kva__seq *s, int seq,
                                               int layer, int n_tokens, float scale, const kva__mla_scratch *w) {
  int H = L->n_heads, d_latent = L->d_latent, d_nope = L->d_nope, d_rope = L->d_rope, d_v = L->d_v;
  int q_width = d_nope + d_rope, len = s->len, t, h, j;
  kva_attn a;
  kva_status st;
  for (j = 0; j < len; j++) {
    kva_seq_read(c, seq, layer, j, w->row, NULL, &w->kpos[j]);
    for (h = 0; h < H; h++) {
      float *kh = w->K + ((size_t)j * (size_t)H + (size_t)h) * (size_t)q_width;
      kva__linear(w->row, 1, d_latent, L->w_uk + (size_t)h * (size_t)d_nope * (size_t)d_latent,
                  L->b_uk ? L->b_uk + (size_t)h * (size_t)d_nope : NULL, d_nope, kh, 1);
      memcpy(kh + d_nope, w->row + d_latent, (size_t)d_rope * sizeof(float));
      kva__linear(w->row, 1, d_latent, L->w_uv + (size_t)h * (size_t)d_v * (size_t)d_latent,
                  L->b_uv ? L->b_uv + (size_t)h * (size_t)d_v : NULL, d_v,
                  w->V + ((size_t)j * (size_t)H + (size_t)h) * (size_t)d_v, 1);
    }
  }
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = H; a.n_threads = L->n_threads;
  a.head_dim = q_width; a.v_dim = d_v; a.scale = scale;
  st = kva_attend(&a, w->q, n_tokens, w->pos, w->K, w->V, len, w->kpos, w->o, w->lse);
  if (st == KVA_OK && kva__accumulates(&s->evict))
    for (j = 0; j < len; j++) {
      int in_block;
      int32_t b = kva__slot_block(c, s, layer, j, &in_block);
      float add = 0.0f;
      for (t = 0; t < n_tokens; t++)
        for (h = 0; h < H; h++) {
          float lt = w->lse[(size_t)t * (size_t)H + (size_t)h];
          const float *qh = w->q + ((size_t)t * (size_t)H + (size_t)h) * (size_t)q_width;
          const float *kh = w->K + ((size_t)j * (size_t)H + (size_t)h) * (size_t)q_width;
          if (w->kpos[j] <= w->pos[t] && lt > -INFINITY) add += expf(scale * kva__dot_f32(qh, kh, q_width) - lt);
        }
      *kva__score_ptr(c, layer, b, 0, in_block) += add;
    }
  return st;
}

KVA_API kva_status kva_mla_forward(const kva_mla_layer *L, kva_cache *c, int seq, int layer, const float *x,
                                   int n_tokens, float *y) {
  kva__seq *s;
  kva__mla_scratch w;
  kva__layout Lo = {NULL, 0, 0};
  int H, d_latent, d_nope, d_rope, q_width, latent_width, nt, t, i, owned;
  float scale, eps;
  void *buf;
  kva_status st;
  if (!L || !c) return KVA_ERR_ARG;
  KVA__REFUSE_WHY(c, kva__mla_check(L, c, layer) != KVA_OK, KVA_ERR_ARG,
                  "the kva_mla_layer's shapes, weights or layer do not fit this LATENT cache");
  KVA__REFUSE(c, n_tokens < 0, KVA_ERR_ARG);
  KVA__REFUSE(c, ((uintptr_t)L->workspace & (sizeof(float) - 1)) != 0, KVA_ERR_ARG);
  KVA__REFUSE(c, n_tokens > 0 && (!x || !y), KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  if (n_tokens == 0) return KVA_OK;
  KVA__REFUSE(c, n_tokens > s->last_append, KVA_ERR_STEP);
  KVA__REFUSE_WHY(c, !kva__store_completes(s, layer, n_tokens), KVA_ERR_NOT_STORED,
                  "an earlier part of the step is not stored in this layer");
  KVA__REFUSE(c, L->naive && c->layer_span[layer] >= 0, KVA_ERR_UNSUPPORTED); /* it reads every token back */

  H = L->n_heads; d_latent = L->d_latent; d_nope = L->d_nope; d_rope = L->d_rope;
  q_width = d_nope + d_rope;
  latent_width = d_latent + d_rope;
  nt = L->n_threads;
  eps = L->norm_eps > 0.0f ? L->norm_eps : 1e-6f;
  scale = L->scale != 0.0f ? L->scale : (float)(1.0 / sqrt((double)q_width));
  kva__mla_layout(&Lo, &w, L, (size_t)n_tokens, (size_t)s->len);
  KVA__REFUSE(c, Lo.overflow, KVA_ERR_NOMEM);
  buf = kva__tmp_take(c, L->workspace, L->workspace_bytes, Lo.size, &owned);
  KVA__REFUSE(c, !buf, KVA_ERR_NOMEM);
  Lo.base = (unsigned char *)buf, Lo.size = 0;
  kva__mla_layout(&Lo, &w, L, (size_t)n_tokens, (size_t)s->len);
  for (t = 0; t < n_tokens; t++) w.pos[t] = (int32_t)(s->pos - n_tokens + t);

  /* queries [n][H][nope | rope] */
  if (L->q_lora_rank) {
    kva__linear(x, n_tokens, L->d_model, L->wq_a, NULL, L->q_lora_rank, w.q_lora, nt);
    kva__rmsnorm(w.q_lora, n_tokens, L->q_lora_rank, L->q_norm, eps);
    kva__linear(w.q_lora, n_tokens, L->q_lora_rank, L->wq_b, NULL, H * q_width, w.q, nt);
  } else {
    kva__linear(x, n_tokens, L->d_model, L->wq, L->bq, H * q_width, w.q, nt);
  }
  /* latent rows [n][c_kv | k_pe]: c_kv normalised, k_pe rotated (one per token) */
  for (t = 0; t < n_tokens; t++) {
    float *row = w.latent + (size_t)t * (size_t)latent_width;
    const float *xt = x + (size_t)t * (size_t)L->d_model;
    for (i = 0; i < d_latent; i++)
      row[i] = kva__dot_f32(xt, L->w_dkv + (size_t)i * (size_t)L->d_model, L->d_model) + (L->b_dkv ? L->b_dkv[i] : 0.0f);
    if (L->kv_norm) kva__rmsnorm(row, 1, d_latent, L->kv_norm, eps);
    for (i = 0; i < d_rope; i++)
      row[d_latent + i] =
          kva__dot_f32(xt, L->w_kr + (size_t)i * (size_t)L->d_model, L->d_model) + (L->b_kr ? L->b_kr[i] : 0.0f);
    if (d_rope > 0) {
      int dim = 0;
      kva__rope_check(&L->rope, d_rope, &dim);
      if (kva__rope_active(&L->rope)) {
        kva__rope_token(&L->rope, dim, row + d_latent, 1, d_rope, w.pos[t]);
        kva__rope_token(&L->rope, dim, w.q + (size_t)t * (size_t)H * (size_t)q_width + d_nope, H, q_width, w.pos[t]);
      }
    }
  }
  st = kva_store(c, seq, layer, w.latent, NULL, n_tokens);
  if (st == KVA_OK)
    st = L->naive ? kva__mla_attend_naive(L, c, s, seq, layer, n_tokens, scale, &w)
                  : kva__mla_attend_absorbed(L, c, seq, layer, n_tokens, scale, &w);
  if (st == KVA_OK) kva__linear(w.o, n_tokens, H * L->d_v, L->wo, L->bo, L->d_model, y, nt);
  kva__tmp_give(c, buf, Lo.size, owned);
  return st;
}

/* ======================================================================
   [11] stats
   ====================================================================== */

/* One demoted block over all layers: rows, and the positions beside them */
static inline size_t kva__demote_block_bytes(const kva_cache *c) {
  if (c->dm_blocks == 0) return 0; /* no demoted pool */
  return (size_t)c->n_layers * (c->dm_block + (size_t)c->G * (size_t)c->bs * sizeof(int32_t));
}

KVA_API void kva_cache_get_stats(const kva_cache *c, kva_cache_stats *st) {
  int i;
  if (!st) return;
  memset(st, 0, sizeof *st);
  if (!c) return;
  st->n_blocks = c->n_blocks;
  st->blocks_free = c->n_free;
  st->blocks_used = c->n_used;
  st->blocks_cached = c->n_cached;
  st->prefix_queries = c->prefix_queries;
  st->prefix_hits = c->prefix_hits;
  st->token_slots = (long)c->n_used * c->bs;
  st->cow_copies = c->cow_copies;
  st->appends_failed = c->appends_failed;
  st->prefix_forgotten = c->prefix_forgotten;
  st->n_seqs = c->n_live;
  st->block_bytes = c->block_bytes;
  st->bytes_total = c->block_bytes * (size_t)c->n_blocks;
  st->bytes_meta = c->bytes_meta;
  st->bytes_footprint = c->alloc_bytes;
  st->bytes_used = c->block_bytes * (size_t)c->n_used;
  for (i = 0; i < c->n_spans; i++) { /* a group's blocks; the hole is bookkeeping */
    const kva__span *sp = &c->spans[i];
    int used = sp->n_blocks - sp->n_free - sp->n_spare;
    st->group_blocks += sp->n_blocks;
    st->group_blocks_used += used;
    st->bytes_total += sp->block_bytes * (size_t)sp->n_blocks;
    st->bytes_used += sp->block_bytes * (size_t)used;
    st->bytes_meta += sp->block_bytes;
  }
  st->tier_spills = c->tier_spills;
  st->tier_spill_errors = c->tier_spill_errors;
  st->tier_fetch_hits = c->tier_fetch_hits;
  st->tier_fetch_misses = c->tier_fetch_misses;
  st->tier_fetch_refused = c->tier_fetch_refused;
  st->tier_loads = c->tier_loads;
  st->demote_blocks = c->dm_blocks;
  st->demote_blocks_used = c->dm_blocks - c->dm_n_free;
  st->demote_block_bytes = kva__demote_block_bytes(c);
  st->bytes_total += st->demote_block_bytes * (size_t)c->dm_blocks;
  st->bytes_used += st->demote_block_bytes * (size_t)st->demote_blocks_used;
  for (i = 0; i < c->max_seqs; i++)
    if (c->seqs[i].live) st->tokens_held += c->seqs[i].len;
}

/* One block's part in a sequence's memory: held by `holders` sequences,
   shared when others hold it too or a publication keeps it. */
static inline void kva__seq_stats_add(kva_seq_stats *st, size_t bytes, int holders, int shared) {
  st->blocks++;
  st->bytes += bytes;
  st->bytes_prorated += (double)bytes / (double)(holders > 0 ? holders : 1);
  if (shared) {
    st->blocks_shared++;
    st->bytes_shared += bytes;
  }
}

/* The memory one sequence holds: main-pool blocks and each WINDOW / CHUNK
   group's blocks it has not released. */
KVA_API kva_status kva_seq_get_stats(const kva_cache *c, int seq, kva_seq_stats *st) {
  const kva__seq *s;
  int i, w;
  if (!c) return KVA_ERR_ARG;
  KVA__REFUSE(c, !st, KVA_ERR_ARG);
  s = kva__seq_get(c, seq);
  if (!s) return kva__refuse(c, KVA_ERR_SEQ, __func__, "no live sequence has this id");
  memset(st, 0, sizeof *st);
  st->tokens = s->len;
  st->tokens_demoted = s->dm_len;
  st->head_slots_empty = s->n_empty;
  st->tokens_evicted = (long)s->pos - s->len - s->dm_len;
  st->demote_blocks = s->dm_n_blocks;
  for (i = 0; i < s->n_blocks; i++) {
    const kva__block *b = &c->blk[s->table[i]];
    kva__seq_stats_add(st, c->block_bytes, b->ref, b->ref > 1 || b->published);
  }
  for (w = 0; w < c->n_spans; w++) {
    const kva__span *sp = &c->spans[w];
    const int32_t *t = kva__span_table(c, s, w);
    for (i = 0; i < s->n_blocks; i++) {
      int32_t b = t[i];
      int holders;
      if (b == kva__span_hole(sp)) continue; /* released */
      holders = sp->ref[b] - (sp->owner[b] >= 0);
      kva__seq_stats_add(st, sp->block_bytes, holders, sp->ref[b] > 1);
    }
  }
  st->bytes += kva__demote_block_bytes(c) * (size_t)s->dm_n_blocks; /* its own copy */
  st->bytes_prorated += (double)(kva__demote_block_bytes(c) * (size_t)s->dm_n_blocks);
  st->bytes_own = st->bytes - st->bytes_shared;
  st->bytes_meta = sizeof(kva__seq) + (size_t)c->dm_max_table * sizeof(int32_t) +
                   (size_t)c->max_table * (1 + (size_t)c->n_spans) * sizeof(int32_t) +
                   (size_t)c->n_layers * 2 * sizeof(int32_t) + (size_t)c->n_spans * sizeof(int32_t);
  return KVA_OK;
}


#endif /* implementation */

#ifdef __cplusplus
}
#endif
#ifdef KVA__POP_DIAGNOSTICS
#pragma GCC diagnostic pop
#endif

#endif /* KVATTN_H */

/*
MIT License

Copyright (c) 2026 the kvattn authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
*/
