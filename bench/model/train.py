#!/usr/bin/python3
"""Train the small Llama-style model used by kvattn's inference example and
quality benchmark.  Python is used only here, to produce the model files; the
library and its programs are C.

End to end: corpus (King James Bible from Debian's bible-kjv), byte-fallback
BPE tokenizer, model training (with a passkey-retrieval task mixed in),
evaluation, and export to the llama2.c legacy checkpoint and tokenizer
formats.  Reproducible: fixed random state, fixed step count, 2 threads.

Run:   /usr/bin/python3 bench/model/train.py          (full run)
       /usr/bin/python3 bench/model/train.py --probe  (time a few steps only)
       /usr/bin/python3 bench/model/train.py --verify (re-check the exported files)
"""
import math
import os
import re
import struct
import subprocess
import sys
import time

# Threads sleep instead of spinning while waiting (the machine is shared).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
RANDOM_STATE = 1234

# ---------------------------------------------------------------- config
DIM = 192
N_LAYERS = 6
N_HEADS = 6
N_KV_HEADS = 2
HIDDEN = 512                      # ~2.7 x DIM
SEQ_LEN = 512
VOCAB_SIZE = 2048
BATCH = 6
STEPS = 700
EARLY_EXPORT_STEP = 60
WARMUP = 40
LR_MAX = 1.5e-3
LR_MIN = 1.5e-4
WEIGHT_DECAY = 0.1
PASSKEY_SHARE = 0.5         # half of these use training prose as filler
ANSWER_WEIGHT = 4.0
EVAL_EVERY = 60
HELDOUT_BOOKS = ["Ruth", "Ecclesiastes", "Jonah", "Galatians", "James", "1 Peter"]
CALIB_BOOK = "Genesis"
CALIB_CHARS = 16000

torch.set_num_threads(2)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- corpus
def load_bible():
    """Return [(book, text)] with each book as one long document: a title
    line, then one paragraph per chapter (verse numbers removed)."""
    raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    # The KJV text has no digits, so a flush-left "Name N" line is a header.
    head_re = re.compile(r"^((?:[1-3] )?[A-Z][A-Za-z ]*) (\d+)$")
    verse_re = re.compile(r"^\s+\d+ (.*)$")
    books = []          # [(name, [[verse, ...] per chapter])]
    for line in raw.split("\n"):
        if not line.strip():
            continue
        m = verse_re.match(line)
        if m:
            books[-1][1][-1].append(m.group(1).strip())
            continue
        h = head_re.match(line)
        if h:
            name, ch = h.group(1), int(h.group(2))
            if not books or books[-1][0] != name:
                assert ch == 1, line
                books.append((name, []))
            assert ch == len(books[-1][1]) + 1, line
            books[-1][1].append([])
            continue
        chap = books[-1][1][-1]
        chap[-1] = chap[-1] + " " + line.strip()
    out = []
    for name, chapters in books:
        parts = [name]
        for ch, verses in enumerate(chapters):
            parts.append("Chapter %d\n%s" % (ch + 1, " ".join(verses)))
        out.append((name, "\n\n".join(parts)))
    return out


# ---------------------------------------------------------------- tokenizer
# Pre-tokenization: an optional leading space plus a run of letters, or an
# optional leading space plus ONE digit or ONE other symbol, or one whitespace
# character.  No learned token crosses these chunk boundaries, so the global
# greedy merge (llama2.c) equals the per-chunk greedy used here.
CHUNK_RE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s")


def chunks_of(text):
    ch = CHUNK_RE.findall(text)
    assert "".join(ch) == text
    return ch


class Tokenizer:
    def __init__(self, pieces, scores):
        self.pieces = pieces            # list of str (byte tokens "<0xNN>")
        self.scores = scores
        self.index = {p: i for i, p in enumerate(pieces)}
        assert len(self.index) == len(pieces), "duplicate pieces"
        self.memo = {}
        self.space_id = self.index[" "]

    def _greedy(self, ids):
        # llama2.c merge loop: best score pair, leftmost on ties.
        while True:
            best, best_i, best_id = -1e30, -1, -1
            for i in range(len(ids) - 1):
                s = self.pieces[ids[i]] + self.pieces[ids[i + 1]]
                j = self.index.get(s)
                if j is not None and self.scores[j] > best:
                    best, best_i, best_id = self.scores[j], i, j
            if best_i < 0:
                return ids
            ids = ids[:best_i] + [best_id] + ids[best_i + 2:]

    def _initial(self, text):
        ids = []
        for c in text:
            j = self.index.get(c)
            if j is not None:
                ids.append(j)
            else:
                ids.extend(b + 3 for b in c.encode("utf-8"))
        return ids

    def encode_chunk(self, c):
        r = self.memo.get(c)
        if r is None:
            r = self._greedy(self._initial(c))
            self.memo[c] = r
        return r

    def encode_raw(self, text):
        """Encoding of text with no dummy prefix and no BOS (text pieces that
        start on a chunk boundary concatenate exactly)."""
        out = []
        for c in chunks_of(text):
            out.extend(self.encode_chunk(c))
        return out

    def encode(self, text, bos=True):
        """As the C side encodes: BOS, dummy-prefix space, greedy merges."""
        out = [1] if bos else []
        if text:
            out.extend(self.encode_raw(" " + text))
        return out

    def encode_global(self, text):
        """Reference: llama2.c's whole-string greedy (slow, for checking)."""
        ids = [self.space_id] + self._initial(text) if text else []
        return [1] + self._greedy(ids)

    def decode(self, ids):
        b = bytearray()
        for i in ids:
            p = self.pieces[i]
            if 3 <= i < 259:
                b.append(i - 3)
            elif i >= 259:
                b.extend(p.encode("utf-8"))
        return b.decode("utf-8", errors="replace")

    def save(self, path):
        data = [p.encode("utf-8") if not (3 <= i < 259) else p.encode("ascii")
                for i, p in enumerate(self.pieces)]
        with open(path, "wb") as f:
            f.write(struct.pack("<i", max(len(d) for d in data)))
            for d, s in zip(data, self.scores):
                f.write(struct.pack("<fi", s, len(d)))
                f.write(d)


def train_bpe(texts, vocab_size):
    freq = {}
    for t in texts:
        for c in chunks_of(" " + t):
            freq[c] = freq.get(c, 0) + 1
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    singles = sorted(set(chr(c) for c in range(32, 127)) | {"\n"} |
                     set(ch for w in freq for ch in w))
    pieces += singles
    scores = [0.0] * len(pieces)
    words = [list(w) for w in freq]
    wfreq = [freq[w] for w in freq]
    pair_count = {}
    pair_words = {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + wfreq[wi]
            pair_words.setdefault((a, b), set()).add(wi)
    known = set(pieces)
    rank = 0
    while len(pieces) < vocab_size and pair_count:
        best = max(pair_count.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pair_count[best] < 2:
            break
        a, b = best
        new = a + b
        for wi in list(pair_words.get(best, ())):
            w = words[wi]
            f = wfreq[wi]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                if pair_count[(x, y)] <= 0:
                    del pair_count[(x, y)]
            i, nw = 0, []
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(new)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for x, y in zip(nw, nw[1:]):
                pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                pair_words.setdefault((x, y), set()).add(wi)
        pair_count.pop(best, None)
        pair_words.pop(best, None)
        if new not in known:
            known.add(new)
            pieces.append(new)
            scores.append(-float(rank))
            rank += 1
    return Tokenizer(pieces, scores)


# ---------------------------------------------------------------- passkey
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
FILLER_SENTS = [" The grass is green.", " The sky is blue.", " The sun is yellow.",
                " Here we go.", " There and back again."]


def key_sentence(k):
    return " The pass key is %s. Remember it. %s is the pass key." % (k, k)


QUESTION = " What is the pass key? The pass key is"


class FillerSource:
    """Filler pieces (each starting with a space) as token lists."""

    def __init__(self, tok, prose_sents):
        self.tok = tok
        self.rep = [tok.encode_raw(s) for s in FILLER_SENTS]
        self.prose = prose_sents        # list of (text, ids)

    def take(self, rng, n_tokens, kind, start=None):
        """About n_tokens of filler (whole sentences, never more)."""
        texts, ids = [], []
        if kind == "rep":
            i = int(rng.integers(5)) if start is None else start
            while True:
                s = self.rep[i % 5]
                if len(ids) + len(s) > n_tokens:
                    break
                texts.append(FILLER_SENTS[i % 5])
                ids.extend(s)
                i += 1
        else:
            i = int(rng.integers(len(self.prose)))
            while True:
                t, s = self.prose[i % len(self.prose)]
                if len(ids) + len(s) > n_tokens:
                    break
                texts.append(t)
                ids.extend(s)
                i += 1
        return "".join(texts), ids


def make_passkey(tok, fill, rng, total, dist, kind):
    """Prompt of about `total` tokens (BOS included) whose key sentence starts
    `dist` tokens before the end of the prompt.  Returns (prompt_text,
    prompt_ids, key, answer_ids)."""
    key = "%05d" % int(rng.integers(100000))
    ks = key_sentence(key)
    k_ids = tok.encode_raw(ks)
    q_ids = tok.encode_raw(QUESTION)
    after_n = max(0, dist - len(k_ids) - len(q_ids))
    t_after, f_after = fill.take(rng, after_n, kind)
    before_n = max(0, total - 1 - len(f_after) - len(k_ids) - len(q_ids))
    t_before, f_before = fill.take(rng, before_n, kind)
    text = t_before + ks + t_after + QUESTION
    ids = [1] + f_before + k_ids + f_after + q_ids
    assert ids == tok.encode(text[1:]), "piecewise passkey encoding mismatch"
    ans = tok.encode_raw(" " + key + ".")
    return text[1:], ids, key, ans


# ---------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        hs = DIM // N_HEADS
        self.att_norm = nn.Parameter(torch.ones(DIM))
        self.wq = nn.Linear(DIM, N_HEADS * hs, bias=False)
        self.wk = nn.Linear(DIM, N_KV_HEADS * hs, bias=False)
        self.wv = nn.Linear(DIM, N_KV_HEADS * hs, bias=False)
        self.wo = nn.Linear(N_HEADS * hs, DIM, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(DIM))
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope_tables(T, hs, dtype):
    i = torch.arange(0, hs, 2, dtype=torch.float64)
    freq = 1.0 / (10000.0 ** (i / hs))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    # x: [B, T, H, hs]; rotate adjacent pairs (x[2i], x[2i+1])
    xr = x.reshape(*x.shape[:-1], -1, 2)
    a, b = xr[..., 0], xr[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB_SIZE, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(N_LAYERS)])
        self.norm = nn.Parameter(torch.ones(DIM))
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if n.endswith("wo.weight") or n.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * N_LAYERS)
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, taps=None):
        # taps: None, or a dict that receives each layer's attention
        # probabilities [B, H, T, T] and per-head outputs [B, H, T, hs]
        # (before wo), for a training script's auxiliary losses
        B, T = idx.shape
        hs = DIM // N_HEADS
        cos, sin = rope_tables(T, hs, self.emb.weight.dtype)
        mask = torch.full((T, T), float("-inf"), dtype=self.emb.weight.dtype).triu(1)
        x = self.emb(idx)
        rep = N_HEADS // N_KV_HEADS
        for L in self.layers:
            h = rmsnorm(x, L.att_norm)
            q = apply_rope(L.wq(h).view(B, T, N_HEADS, hs), cos, sin)
            k = apply_rope(L.wk(h).view(B, T, N_KV_HEADS, hs), cos, sin)
            v = L.wv(h).view(B, T, N_KV_HEADS, hs)
            k = k.repeat_interleave(rep, dim=2)       # query head h uses kv head h // rep
            v = v.repeat_interleave(rep, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            att = (q * (1.0 / math.sqrt(hs))) @ k.transpose(-1, -2) + mask
            att = F.softmax(att, dim=-1)
            o = att @ v
            if taps is not None:
                taps.setdefault("att", []).append(att)
                taps.setdefault("out", []).append(o)
            o = o.transpose(1, 2).reshape(B, T, DIM)
            x = x + L.wo(o)
            h = rmsnorm(x, L.ffn_norm)
            x = x + L.w2(F.silu(L.w1(h)) * L.w3(h))
        x = rmsnorm(x, self.norm)
        return x @ self.emb.weight.t()


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def export(model, path):
    hs = DIM // N_HEADS
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<7i", DIM, HIDDEN, N_LAYERS, N_HEADS, N_KV_HEADS,
                            VOCAB_SIZE, SEQ_LEN))

        def w(t):
            f.write(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
        w(model.emb.weight)
        for name in ["att_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"]:
            for L in model.layers:
                p = getattr(L, name)
                w(p if isinstance(p, torch.Tensor) else p.weight)
        w(model.norm)
        cos, sin = rope_tables(SEQ_LEN, hs, torch.float32)
        w(cos)
        w(sin)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- independent loader
def load_bin_numpy(path):
    with open(path, "rb") as f:
        buf = f.read()
    dim, hid, nl, nh, nkv, vs, sl = struct.unpack("<7i", buf[:28])
    shared = vs > 0
    vs = abs(vs)
    a = np.frombuffer(buf, dtype="<f4", offset=28).astype(np.float64)
    hs = dim // nh
    kvd = dim * nkv // nh
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        r = a[off:off + n].reshape(shape)
        off += n
        return r
    W = dict(dim=dim, hid=hid, nl=nl, nh=nh, nkv=nkv, vs=vs, sl=sl)
    W["emb"] = take(vs, dim)
    W["rms_att"] = take(nl, dim)
    W["wq"] = take(nl, dim, dim)
    W["wk"] = take(nl, kvd, dim)
    W["wv"] = take(nl, kvd, dim)
    W["wo"] = take(nl, dim, dim)
    W["rms_ffn"] = take(nl, dim)
    W["w1"] = take(nl, hid, dim)
    W["w2"] = take(nl, dim, hid)
    W["w3"] = take(nl, hid, dim)
    W["rms_final"] = take(dim)
    take(sl, hs // 2)
    take(sl, hs // 2)
    W["cls"] = W["emb"] if shared else take(vs, dim)
    assert off == a.size, "trailing data in model.bin"
    return W


def numpy_forward(W, ids):
    """Token-by-token decode with a KV cache, float64, as a C program would."""
    dim, nl, nh, nkv = W["dim"], W["nl"], W["nh"], W["nkv"]
    hs = dim // nh
    kvd = hs * nkv
    T = len(ids)
    kc = np.zeros((nl, T, kvd))
    vc = np.zeros((nl, T, kvd))
    out = []

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x) + 1e-5) * w
    for pos, tkn in enumerate(ids):
        x = W["emb"][tkn].copy()
        for l in range(nl):
            h = rms(x, W["rms_att"][l])
            q = W["wq"][l] @ h
            k = W["wk"][l] @ h
            v = W["wv"][l] @ h
            for vec in (q, k):
                for i in range(0, vec.size, 2):
                    fr = 10000.0 ** (-(i % hs) / hs)
                    c, s = math.cos(pos * fr), math.sin(pos * fr)
                    a0, a1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = a0 * c - a1 * s, a0 * s + a1 * c
            kc[l, pos] = k
            vc[l, pos] = v
            o = np.zeros(dim)
            for hh in range(nh):
                g = hh // (nh // nkv)
                qh = q[hh * hs:(hh + 1) * hs]
                sc = kc[l, :pos + 1, g * hs:(g + 1) * hs] @ qh / math.sqrt(hs)
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                o[hh * hs:(hh + 1) * hs] = sc @ vc[l, :pos + 1, g * hs:(g + 1) * hs]
            x = x + W["wo"][l] @ o
            h = rms(x, W["rms_ffn"][l])
            a1 = W["w1"][l] @ h
            x = x + W["w2"][l] @ ((a1 / (1 + np.exp(-a1))) * (W["w3"][l] @ h))
        x = rms(x, W["rms_final"])
        out.append(W["cls"] @ x)
    return np.array(out)


# ---------------------------------------------------------------- data
class Data:
    def __init__(self):
        t0 = time.time()
        books = load_bible()
        assert len(books) == 66, len(books)
        names = [b for b, _ in books]
        for b in HELDOUT_BOOKS:
            assert b in names, b
        self.train_books = [(b, t) for b, t in books if b not in HELDOUT_BOOKS]
        self.held_books = [(b, t) for b, t in books if b in HELDOUT_BOOKS]
        self.heldout_text = "\n\n".join(t for _, t in self.held_books) + "\n"
        cal = dict(self.train_books)[CALIB_BOOK]
        cut = cal.rfind(" ", 0, CALIB_CHARS)
        self.calib_text = cal[:cut] + "\n"
        log("corpus: %d train books (%d chars), %d held-out books (%d chars)" % (
            len(self.train_books), sum(len(t) for _, t in self.train_books),
            len(self.held_books), len(self.heldout_text)))
        self.tok = train_bpe([t for _, t in self.train_books], VOCAB_SIZE)
        assert len(self.tok.pieces) == VOCAB_SIZE, len(self.tok.pieces)
        log("tokenizer: %d pieces, %.1fs" % (len(self.tok.pieces), time.time() - t0))
        stream = []
        for _, t in self.train_books:
            stream.extend(self.tok.encode(t))
        self.stream = np.array(stream, dtype=np.int64)
        self.held_ids = self.tok.encode(self.heldout_text)
        log("train tokens %d (%.2f chars/token), held-out tokens %d" % (
            len(self.stream), sum(len(t) for _, t in self.train_books) / len(self.stream),
            len(self.held_ids)))
        # prose filler: training sentences, each starting with a space
        prose = []
        for _, t in self.train_books:
            for para in t.split("\n"):
                if para.startswith("Chapter") or len(para) < 200:
                    continue
                for s in re.findall(r"[^.;:?!]+[.;:?!]", para):
                    s = " " + s.strip()
                    prose.append((s, self.tok.encode_raw(s)))
        self.fill = FillerSource(self.tok, prose)
        log("prose filler sentences: %d" % len(prose))

    def check_tokenizer(self):
        # Every learned piece is a single pre-tokenization chunk, so no pair
        # across a chunk boundary can ever concatenate to a piece: the global
        # greedy equals the per-chunk greedy on any text.
        for p in self.tok.pieces[259:]:
            assert len(chunks_of(p)) == 1, p
        rng = np.random.default_rng(7)
        samples = [self.heldout_text[:3000], self.calib_text[:2000],
                   "Hello, World!  Caf\u00e9 \u2014 naïve 12345\n\nThe pass key is 00417.",
                   key_sentence("48213") + QUESTION]
        for _ in range(4):
            b = self.train_books[int(rng.integers(len(self.train_books)))][1]
            o = int(rng.integers(len(b) - 1500))
            samples.append(b[o:o + 1500])
        for s in samples:
            a, g = self.tok.encode(s), self.tok.encode_global(s)
            assert a == g, "per-chunk encoding differs from global greedy"
            assert self.tok.decode(a[1:]) == " " + s
        log("tokenizer check: per-chunk == global greedy on %d samples" % len(samples))

    def batch(self, rng):
        """Inputs, targets and per-target loss weights (answer digits of
        passkey documents weigh ANSWER_WEIGHT, everything else 1)."""
        xs, ws = [], []
        for _ in range(BATCH):
            w = np.ones(SEQ_LEN, dtype=np.float32)
            r = rng.random()
            if r < PASSKEY_SHARE:
                seq, a0, n = self.passkey_seq(rng)
                w[a0 - 1:a0 - 1 + n] = ANSWER_WEIGHT
                xs.append(seq)
            else:
                o = int(rng.integers(len(self.stream) - SEQ_LEN - 1))
                xs.append(self.stream[o:o + SEQ_LEN + 1])
            ws.append(w)
        x = torch.from_numpy(np.stack(xs))
        return x[:, :-1], x[:, 1:], torch.from_numpy(np.stack(ws))

    def passkey_seq(self, rng):
        total = int(rng.integers(48, SEQ_LEN - 8))
        dist = int(rng.integers(30, total))
        kind = "rep" if rng.random() < 0.5 else "prose"
        _, ids, _, ans = make_passkey(self.tok, self.fill, rng, total, dist, kind)
        seq = ids + ans + self.tok.encode_raw("\n")
        need = SEQ_LEN + 1 - len(seq)
        if need > 0:
            o = int(rng.integers(len(self.stream) - need))
            seq = seq + [1] + list(self.stream[o:o + need - 1])
        # answer digits (without the final ".") sit at seq[len(ids):...]
        return np.array(seq[:SEQ_LEN + 1], dtype=np.int64), len(ids), len(ans) - 1


# ---------------------------------------------------------------- evaluation
def make_passkey_eval(data, n_per=20, kind="rep", state=999):
    rng = np.random.default_rng(state)
    cases = []
    for frac in (0.25, 0.5, 0.9):
        for _ in range(n_per):
            total = SEQ_LEN - 16
            text, ids, key, ans = make_passkey(data.tok, data.fill, rng, total,
                                               int(round(frac * SEQ_LEN)), kind)
            assert len(ids) + len(ans) <= SEQ_LEN
            cases.append((frac, key, text, ids, ans))
    return cases


@torch.no_grad()
def passkey_accuracy(model, cases):
    """Greedy (teacher-forced argmax == exact greedy while correct) check that
    the answer digits are generated.  Returns ({frac: accuracy}, fraction of
    answer tokens predicted right)."""
    model.eval()
    res = {}
    tok_ok = []
    for frac, key, text, ids, ans in cases:
        digits = ans[:-1]                   # without the final "."
        seq = torch.tensor([ids + digits])
        logits = model(seq)[0]
        pred = logits[len(ids) - 1:len(ids) - 1 + len(digits)].argmax(-1).tolist()
        ok = pred == digits
        res.setdefault(frac, []).append(ok)
        tok_ok.extend(a == b for a, b in zip(pred, digits))
    model.train()
    return {f: sum(v) / len(v) for f, v in res.items()}, sum(tok_ok) / len(tok_ok)


@torch.no_grad()
def heldout_loss(model, ids, max_windows=None):
    model.eval()
    tot, n = 0.0, 0
    ids = torch.tensor(ids)
    starts = list(range(0, len(ids) - 1, SEQ_LEN))
    if max_windows:
        starts = starts[:max_windows]
    for s in starts:
        x = ids[s:s + SEQ_LEN]
        y = ids[s + 1:s + SEQ_LEN + 1]
        x = x[:len(y)]
        logits = model(x[None])[0]
        tot += F.cross_entropy(logits, y, reduction="sum").item()
        n += len(y)
    model.train()
    return tot / n


def write_eval_files(data, cases):
    with open(os.path.join(HERE, "heldout.txt"), "w") as f:
        f.write(data.heldout_text)
    with open(os.path.join(HERE, "heldout.ids"), "w") as f:
        f.write(" ".join(map(str, data.held_ids)) + "\n")
    with open(os.path.join(HERE, "calib.txt"), "w") as f:
        f.write(data.calib_text)
    with open(os.path.join(HERE, "passkey.tsv"), "w") as f:
        for frac, key, text, ids, ans in cases:
            assert "\t" not in text and "\n" not in text
            f.write("%g\t%s\t%s\n" % (frac, key, text))


REF_SENTENCE = ("And it came to pass, when the king heard the words of the book "
                "of the law, that he rent his clothes.")


def write_ref_logits(data, model_path):
    ids = data.tok.encode(REF_SENTENCE)
    W = load_bin_numpy(model_path)
    ref = numpy_forward(W, ids)
    # cross-check with the PyTorch model built from the exported weights, float64
    m = Model().double()
    load_into_torch(m, W)
    with torch.no_grad():
        tl = m(torch.tensor([ids]))[0].numpy()
    err = np.abs(tl - ref).max()
    log("ref logits: %d positions, numpy-decode vs torch-prefill max |diff| %.3g" % (len(ids), err))
    assert err < 1e-9, err
    with open(os.path.join(HERE, "ref_logits.txt"), "w") as f:
        f.write("# line 2: prompt token ids (BOS + encode of %r); then one line per position: "
                "the %d logits computed in float64 from the float32 weights of model.bin, %%.9g\n"
                % (REF_SENTENCE, W["vs"]))
        f.write(" ".join(map(str, ids)) + "\n")
        for row in ref:
            f.write(" ".join("%.9g" % v for v in row) + "\n")
    return err


def load_into_torch(m, W):
    with torch.no_grad():
        m.emb.weight.copy_(torch.from_numpy(W["emb"]))
        m.norm.copy_(torch.from_numpy(W["rms_final"]))
        for l, L in enumerate(m.layers):
            L.att_norm.copy_(torch.from_numpy(W["rms_att"][l]))
            L.ffn_norm.copy_(torch.from_numpy(W["rms_ffn"][l]))
            for n in ["wq", "wk", "wv", "wo", "w1", "w2", "w3"]:
                getattr(L, n).weight.copy_(torch.from_numpy(W[n][l]))


def export_all(model, data, tag):
    export(model, os.path.join(HERE, "model.bin"))
    data.tok.save(os.path.join(HERE, "tokenizer.bin"))
    log("exported model.bin + tokenizer.bin (%s)" % tag)


# ---------------------------------------------------------------- main
def main():
    probe = "--probe" in sys.argv
    torch.manual_seed(RANDOM_STATE)
    rng = np.random.default_rng(RANDOM_STATE)
    data = Data()
    data.check_tokenizer()
    cases = make_passkey_eval(data, kind="rep", state=999)
    cases_prose = make_passkey_eval(data, n_per=10, kind="prose", state=998)
    if not probe:
        write_eval_files(data, cases)
        data.tok.save(os.path.join(HERE, "tokenizer.bin"))
    model = Model()
    log("model: dim %d hidden %d layers %d heads %d kv_heads %d vocab %d seq %d: %d params"
        % (DIM, HIDDEN, N_LAYERS, N_HEADS, N_KV_HEADS, VOCAB_SIZE, SEQ_LEN, n_params(model)))
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=LR_MAX, betas=(0.9, 0.95), eps=1e-8)
    steps = 6 if probe else STEPS
    t0 = time.time()
    ema = None
    for step in range(1, steps + 1):
        if step <= WARMUP:
            lr = LR_MAX * step / WARMUP
        else:
            p = (step - WARMUP) / max(1, STEPS - WARMUP)
            lr = LR_MIN + 0.5 * (LR_MAX - LR_MIN) * (1 + math.cos(math.pi * p))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, wt = data.batch(rng)
        logits = model(x)
        ce = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1), reduction="none")
        loss = (ce * wt.reshape(-1)).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        el = time.time() - t0
        if probe or step % 10 == 0:
            log("step %d/%d loss %.4f (ema %.4f) lr %.2e  %.2fs/step  elapsed %.0fs" % (
                step, steps, loss.item(), ema, lr, el / step, el))
        if probe:
            continue
        if step == EARLY_EXPORT_STEP:
            export_all(model, data, "early, step %d" % step)
        if step % EVAL_EVERY == 0 or step == STEPS:
            hl = heldout_loss(model, data.held_ids, max_windows=8)
            pk, pt = passkey_accuracy(model, cases[::4])
            log("eval step %d: held-out loss (8 windows) %.4f  passkey %s (answer tokens %.2f)" % (
                step, hl, " ".join("%g:%.2f" % kv for kv in sorted(pk.items())), pt))
    train_time = time.time() - t0
    if probe:
        log("probe: %.2f s/step" % (train_time / steps))
        return
    export_all(model, data, "final, step %d" % STEPS)
    # final evaluation
    final_train = heldout_loss(model, list(data.stream[:200 * SEQ_LEN]), max_windows=60)
    hl = heldout_loss(model, data.held_ids)
    pk = passkey_accuracy(model, cases)
    pkp = passkey_accuracy(model, cases_prose)
    log("FINAL train-split loss (first 60 windows) %.4f" % final_train)
    log("FINAL held-out loss %.4f nats/token, perplexity %.2f (%d tokens)" % (
        hl, math.exp(hl), len(data.held_ids) - 1))
    log("FINAL passkey (repeated filler, passkey.tsv) %s answer tokens %.2f" % pk)
    log("FINAL passkey (prose filler) %s answer tokens %.2f" % pkp)
    log("FINAL training wall time %.1f min, EMA train loss %.4f" % (train_time / 60, ema))
    write_ref_logits(data, os.path.join(HERE, "model.bin"))


def verify():
    data = Data()
    data.check_tokenizer()
    p = os.path.join(HERE, "model.bin")
    W = load_bin_numpy(p)
    m = Model()
    load_into_torch(m, {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v)
                        for k, v in W.items()})
    cases = make_passkey_eval(data, kind="rep", state=999)
    ids = [int(t) for t in open(os.path.join(HERE, "heldout.ids")).read().split()]
    assert ids == data.held_ids
    log("verify: held-out loss %.4f, passkey %s" % (
        heldout_loss(m, data.held_ids), passkey_accuracy(m, cases)))
    write_ref_logits(data, p)


if __name__ == "__main__":
    if "--verify" in sys.argv:
        verify()
    else:
        main()
