#!/usr/bin/python3
"""Train the retrieval model: a small Llama-style model (GQA, head size 64,
2,048-token context) that both models prose and retrieves what its context
said far back (a single pass key, or one of several named keys), so that the
quality benchmark can show what a KV-cache configuration costs where it
matters.  Python is used only here, to produce the model files; the library
and its programs are C.

Training is a curriculum (see PHASES): short sequences dense with named keys
and questions first, then longer sequences where a few keys hide in real
prose, then the full context.  Three auxiliary losses, used in training only,
lead two heads into the circuit retrieval needs (README.md, "Why the
auxiliary losses"); the model is a plain Llama model and is run as one.  It
runs in the background for hours and may be stopped at any time: it saves a
checkpoint (model, optimizer, step, elapsed time) every CKPT_MINUTES and
resumes from it exactly, because every batch is drawn from a random state
derived from (RANDOM_STATE, step) alone.

Run:   /usr/bin/python3 bench/retrieval/train.py            (train or resume)
       /usr/bin/python3 bench/retrieval/train.py --probe    (time a few steps per phase)
       /usr/bin/python3 bench/retrieval/train.py --eval     (evaluate the checkpoint)
       /usr/bin/python3 bench/retrieval/train.py --export   (write model.bin and the test files)
       /usr/bin/python3 bench/retrieval/train.py --check-resume  (stop and resume a tiny run: same weights?)
       /usr/bin/python3 bench/retrieval/train.py --check-data    (do the retrieval sources hold their tokens?)
Needs: apt-get install python3-torch libopenblas0-openmp bible-kjv
"""
import math
import re
import os
import struct
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PROSE_DIR = os.path.join(os.path.dirname(HERE), "model")


def _load_prose_module():
    # the prose model's script, by path (both scripts are named train.py)
    import importlib.util
    spec = importlib.util.spec_from_file_location("prose_train", os.path.join(PROSE_DIR, "train.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# corpus, tokenizer, RoPE and the independent numpy loader
prose = _load_prose_module()

RANDOM_STATE = int(os.environ.get("TRAIN_SEED", "4321"))
THREADS = int(os.environ.get("TRAIN_THREADS", "2"))
torch.set_num_threads(THREADS)

# ---------------------------------------------------------------- config
DIM = 256
N_LAYERS = 4
N_HEADS = 4
N_KV_HEADS = 2
HEAD_SIZE = DIM // N_HEADS        # 64
HIDDEN = 704                      # ~2.75 x DIM, a multiple of 64
SEQ_LEN = 2048
VOCAB_SIZE = 2048                 # the prose model's tokenizer, reused as is

# (steps, sequence length, sequences per batch, share of dense key documents,
#  of haystack documents (keys in prose filler)); the rest is plain prose.
PHASES = [
    (1200, 128, 16, 0.60, 0.20),
    (600, 256, 8, 0.40, 0.40),
    (500, 512, 4, 0.25, 0.50),
    (500, 1024, 2, 0.25, 0.55),
    (900, 2048, 1, 0.20, 0.60),
    # the second stage: more of the long contexts, denser with keys
    (800, 1024, 2, 0.45, 0.45),
    (700, 2048, 1, 0.35, 0.55),
]
# Learning-rate stages over the phases: (first phase, last phase, warm-up steps, peak, floor).
# In each: a linear warm-up from the previous stage's floor (0 for the first), the peak, then a
# cosine to the floor over the stage's last DECAY_STEPS steps.
STAGES = [(0, 4, 100, 2e-3, 2e-4), (5, 6, 50, 1e-3, 1e-4)]
DECAY_STEPS = 400
WEIGHT_DECAY = 0.1
ANSWER_WEIGHT = 3.0
# Token embeddings start at this standard deviation (norm ~3.2 at dim 256)
# rather than 0.02: with tied embeddings small ones collapse towards a common
# direction (cosine 0.7-0.9 between tokens after 300 steps here), and the
# digits a retrieval head must copy become hard to tell apart.
EMB_STD = 0.2
# Auxiliary losses (training only; README.md, "Why the auxiliary losses"):
AUX_PREV = 1.0        # layer 0, query head 0 attends to the previous token
AUX_RETRIEVE = 1.0    # last layer, query head 0, at each answer token, attends to that token in its needle
AUX_COPY = 1.0        # and that head's output alone, through the classifier, names the token
CKPT_MINUTES = 5
EVAL_EVERY = 100

STATE_DIR = os.environ.get("TRAIN_STATE_DIR", os.path.join(HERE, "state"))
CKPT = os.path.join(STATE_DIR, "ckpt.pt")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- retrieval texts
# The texts are plain sentences, so that any tokenizer can build the same
# cases (the C bench does, from a user's tokenizer).
NAMES = ("Abraham Isaac Jacob Joseph Moses Aaron Joshua Samuel David Solomon "
         "Elijah Elisha Isaiah Jeremiah Daniel Jonah Ruth Esther Sarah Rachel "
         "Leah Rebekah Miriam Deborah Gideon Samson Saul Jonathan Absalom Nathan "
         "Ezra Nehemiah Job Noah Adam Seth Enoch Laban Esau Benjamin Judah Levi "
         "Simeon Reuben Gad Asher Dan Naphtali Zebulun Issachar Ephraim Manasseh "
         "Caleb Boaz Eli Hannah Peter Andrew James John Philip Thomas Matthew Paul").split()


def digits(rng, n=5):
    return "".join(str(int(d)) for d in rng.integers(0, 10, n))


def single_needle(k):
    return " The pass key is %s. Remember it. %s is the pass key." % (k, k)


SINGLE_QUESTION = " What is the pass key? The pass key is"


def named_needle(name, k):
    return " The pass key of %s is %s." % (name, k)


def named_question(name):
    return " What is the pass key of %s? The pass key of %s is" % (name, name)


class Corpus:
    """Training prose (a token stream and sentences for filler), held-out
    prose (sentences for evaluation filler), and the tokenizer."""

    def __init__(self):
        books = prose.load_bible()
        self.tok = read_tokenizer(os.path.join(PROSE_DIR, "tokenizer.bin"))
        train = [t for b, t in books if b not in prose.HELDOUT_BOOKS]
        held = [t for b, t in books if b in prose.HELDOUT_BOOKS]
        stream = []
        for t in train:
            stream.extend(self.tok.encode(t))
        self.stream = np.array(stream, dtype=np.int64)
        self.heldout_text = "\n\n".join(held) + "\n"
        self.calib_text = train[0][:12000]    # the start of the first training book
        self.held_ids = self.tok.encode(self.heldout_text)
        self.train_sents = self.sentences(train)
        self.held_sents = self.sentences(held)
        self.space_digits = [self.tok.encode_raw(" %d" % d) for d in range(10)]
        log("corpus: %d training tokens, %d held-out tokens, %d / %d filler sentences"
            % (len(self.stream), len(self.held_ids), len(self.train_sents), len(self.held_sents)))

    def sentences(self, texts):
        out = []
        for t in texts:
            for para in t.split("\n"):
                if para.startswith("Chapter") or len(para) < 120:
                    continue
                for s in re.findall(r"[^.;:?!]+[.;:?!]", para):
                    s = " " + s.strip()
                    out.append((s, self.tok.encode_raw(s)))
        return out

    def filler(self, rng, n_tokens, sents):
        """Consecutive sentences [(text, ids)] from a random place, about
        n_tokens in all (never more)."""
        out, n = [], 0
        i = int(rng.integers(len(sents)))
        while n + len(sents[i % len(sents)][1]) <= n_tokens:
            out.append(sents[i % len(sents)])
            n += len(out[-1][1])
            i += 1
        return out


def read_tokenizer(path):
    with open(path, "rb") as f:
        buf = f.read()
    off = 4
    pieces, scores = [], []
    while off < len(buf):
        s, n = struct.unpack_from("<fi", buf, off)
        off += 8
        pieces.append(buf[off:off + n].decode("utf-8"))
        scores.append(s)
        off += n
    assert len(pieces) == VOCAB_SIZE, len(pieces)
    return prose.Tokenizer(pieces, scores)


# ---------------------------------------------------------------- documents
def haystack(corpus, rng, total, needles, question, sents, depths=None):
    """A prompt of about `total` tokens (BOS included): filler prose with the
    needle sentences at the given depths (fractions of the filler, placed on
    sentence boundaries; random when None), then the question.  Returns
    (text, ids, where each needle starts in ids)."""
    tok = corpus.tok
    n_ids = [tok.encode_raw(s) for s in needles]
    q_ids = tok.encode_raw(question)
    room = max(0, total - 1 - len(q_ids) - sum(len(x) for x in n_ids))
    fill = corpus.filler(rng, room, sents)
    cum = [0]
    for _, s in fill:
        cum.append(cum[-1] + len(s))
    if depths is None:
        depths = sorted(rng.random(len(needles)))
    text, ids, at = "", [1], 0
    starts = [0] * len(needles)
    for j in sorted(range(len(needles)), key=lambda j: depths[j]):
        cut = min(max(int(np.searchsorted(cum, depths[j] * cum[-1])), at), len(fill))
        for t, s in fill[at:cut]:
            text += t
            ids += s
        at = cut
        text += needles[j]
        starts[j] = len(ids)
        ids += n_ids[j]
    for t, s in fill[at:]:
        text += t
        ids += s
    return text + question, ids + q_ids, starts


def answer_ids(corpus, k):
    return corpus.tok.encode_raw(" " + k + ".")


def digit_sources(corpus, needle_ids, start, k):
    """Where the answer's tokens (all but the final full stop: " NNNNN", which
    is six tokens, or five when " 2" is one piece) start in the document, at
    each occurrence in the needle (needle_ids placed at start): answer token
    j is retrieved from these positions + j."""
    core = answer_ids(corpus, k)[:-1]
    n = len(core)
    return [start + i for i in range(len(needle_ids) - n + 1) if needle_ids[i:i + n] == core]


def dense_keys_doc(corpus, rng, T):
    """Dense associative recall in sentences: named keys, a little prose,
    then questions about most of them, each answered.  Returns (ids, answer
    spans [(start, length, digit sources)] in ids)."""
    tok = corpus.tok
    ids, spans = [1], []
    # about 11 tokens a key and 22 a question with its answer: all fit in T
    n = int(rng.integers(2, max(3, T // 36) + 1))
    n = min(n, len(NAMES))
    names = list(rng.choice(NAMES, n, replace=False))
    keys = [digits(rng) for _ in names]
    sources = []
    for nm, k in zip(names, keys):
        n_ids = tok.encode_raw(named_needle(nm, k))
        sources.append(digit_sources(corpus, n_ids, len(ids), k))
        ids += n_ids
        if rng.random() < 0.3:
            for _, f in corpus.filler(rng, int(rng.integers(5, 40)), corpus.train_sents):
                ids += f
    order = rng.permutation(n)
    for j in order:
        if len(ids) > T:
            break
        ids += tok.encode_raw(named_question(names[j]))
        a = answer_ids(corpus, keys[j])
        spans.append((len(ids), len(a) - 1, sources[j]))
        ids += a
    return ids, spans


def haystack_doc(corpus, rng, T):
    """A single pass key or 2-8 named keys in training prose, then one or
    more questions, each answered."""
    tok = corpus.tok
    if rng.random() < 0.4:
        k = digits(rng)
        needles, qa = [single_needle(k)], [(SINGLE_QUESTION, k, 0)]
    else:
        n = int(rng.integers(2, 9))
        names = list(rng.choice(NAMES, n, replace=False))
        keys = [digits(rng) for _ in names]
        needles = [named_needle(a, b) for a, b in zip(names, keys)]
        nq = int(rng.integers(1, min(n, 3) + 1))
        qs = rng.choice(n, nq, replace=False)
        qa = [(named_question(names[j]), keys[j], j) for j in qs]
    tail = sum(len(tok.encode_raw(q)) + 7 for q, _, _ in qa[1:]) + 7
    total = int(rng.integers(T // 4, T + 1)) - tail
    _, ids, starts = haystack(corpus, rng, max(total, 40), needles, qa[0][0], corpus.train_sents)
    spans = []
    for i, (q, k, j) in enumerate(qa):
        if i > 0:
            ids += tok.encode_raw(q)
        a = answer_ids(corpus, k)
        src = digit_sources(corpus, tok.encode_raw(needles[j]), starts[j], k)
        spans.append((len(ids), len(a) - 1, src))
        ids += a
    return ids, spans


def schedule():
    """[(first step, last step, phase)]"""
    out, at = [], 1
    for p in PHASES:
        out.append((at, at + p[0] - 1, p))
        at += p[0]
    return out


def phase_of(step):
    for first, last, p in schedule():
        if first <= step <= last:
            return p
    return PHASES[-1]


def total_steps():
    return schedule()[-1][1]


MAX_SOURCES = 2                   # a single pass key states its digits twice


def batch(corpus, step, phase=None):
    """Inputs, targets, loss weights and retrieval sources of one step: a
    function of the step alone, so a resumed run sees the same data as an
    uninterrupted one.  sources[b, t] holds the positions the last layer's
    first head should read when position t predicts an answer token (-1:
    none)."""
    rng = np.random.default_rng([RANDOM_STATE, step])
    _, T, B, dense, hay = phase or phase_of(step)
    xs, ws = [], []
    src = np.full((B, T, MAX_SOURCES), -1, dtype=np.int64)
    for b in range(B):
        r = rng.random()
        w = np.ones(T, dtype=np.float32)
        if r < dense + hay:
            ids, spans = (dense_keys_doc if r < dense else haystack_doc)(corpus, rng, T)
            ids = ids + corpus.tok.encode_raw("\n")
            need = T + 1 - len(ids)
            if need > 0:                  # pad with a new prose document
                o = int(rng.integers(len(corpus.stream) - need))
                ids = ids + [1] + list(corpus.stream[o:o + need - 1])
            ids = ids[:T + 1]
            for s, n, occ in spans:       # target index t predicts ids[t + 1]
                lo, hi = s - 1, min(s - 1 + n, T)
                if lo < T:
                    w[lo:hi] = ANSWER_WEIGHT
                assert occ, "the answer's tokens are not in its needle"
                for j in range(n):        # answer token j is ids[s + j], predicted at s + j - 1
                    t = s + j - 1
                    if t < T:
                        for i, o in enumerate(occ[:MAX_SOURCES]):
                            src[b, t, i] = o + j
            xs.append(np.array(ids, dtype=np.int64))
        else:
            o = int(rng.integers(len(corpus.stream) - T - 1))
            xs.append(corpus.stream[o:o + T + 1])
        ws.append(w)
    x = torch.from_numpy(np.stack(xs))
    return x[:, :-1], x[:, 1:], torch.from_numpy(np.stack(ws)), torch.from_numpy(src)


# ---------------------------------------------------------------- model
def make_model():
    """The prose script's model (llama2.c's architecture) at this script's
    shape: its module constants are set to ours first."""
    for k in ("DIM", "N_LAYERS", "N_HEADS", "N_KV_HEADS", "HIDDEN", "SEQ_LEN", "VOCAB_SIZE"):
        setattr(prose, k, globals()[k])
    m = prose.Model()
    torch.nn.init.normal_(m.emb.weight, 0.0, EMB_STD)
    return m


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": nodecay, "weight_decay": 0.0}],
                             lr=STAGES[0][3], betas=(0.9, 0.95), eps=1e-8)


def lr_at(step):
    sched = schedule()
    start = 0.0
    for first_phase, last_phase, warmup, peak, floor in STAGES:
        first, last = sched[first_phase][0], sched[last_phase][1]
        if step <= last or last_phase == len(PHASES) - 1:
            local = step - first + 1
            if local <= warmup:
                return start + (peak - start) * local / warmup
            if step <= last - DECAY_STEPS:
                return peak
            p = min(1.0, (step - (last - DECAY_STEPS)) / DECAY_STEPS)
            return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * p))
        start = floor
    return STAGES[-1][4]


# ---------------------------------------------------------------- evaluation
DEPTHS = (0.10, 0.25, 0.50, 0.75, 0.90)


def eval_cases(corpus, T, n_per, state):
    """Single-key and multi-key (4 named keys, one asked) prompts of about T
    tokens in held-out prose, n_per per depth.  [(kind, depth, key, ids)]"""
    rng = np.random.default_rng(state)
    cases = []
    for d in DEPTHS:
        for _ in range(n_per):
            k = digits(rng)
            _, ids, _ = haystack(corpus, rng, T - 8, [single_needle(k)], SINGLE_QUESTION,
                              corpus.held_sents, depths=[d])
            cases.append(("single", d, k, ids))
            names = list(rng.choice(NAMES, 4, replace=False))
            keys = [digits(rng) for _ in names]
            dep = [float(rng.random()) for _ in names]
            dep[0] = d
            _, ids, _ = haystack(corpus, rng, T - 8,
                                 [named_needle(a, b) for a, b in zip(names, keys)],
                              named_question(names[0]), corpus.held_sents, depths=dep)
            cases.append(("multi", d, keys[0], ids))
    return cases


@torch.no_grad()
def retrieval_accuracy(model, corpus, cases):
    """Exact greedy match of the answer digits (teacher-forced argmax equals
    greedy decoding while every digit is right).  {(kind, depth): accuracy}"""
    model.eval()
    res, digit_ok = {}, []
    for kind, d, k, ids in cases:
        a = answer_ids(corpus, k)[:-1]
        logits = model(torch.tensor([ids + a]))[0]
        pred = logits[len(ids) - 1:len(ids) - 1 + len(a)].argmax(-1).tolist()
        res.setdefault((kind, d), []).append(pred == a)
        digit_ok += [x == y for x, y in zip(pred, a)]
    model.train()
    acc = {key: sum(v) / len(v) for key, v in res.items()}
    acc["digits"] = sum(digit_ok) / len(digit_ok)
    return acc


@torch.no_grad()
def heldout_loss(model, ids, T, max_windows):
    model.eval()
    tot, n = 0.0, 0
    ids = torch.tensor(ids)
    for s in list(range(0, len(ids) - 1, T))[:max_windows]:
        y = ids[s + 1:s + T + 1]
        x = ids[s:s + len(y)]
        tot += F.cross_entropy(model(x[None])[0], y, reduction="sum").item()
        n += len(y)
    model.train()
    return tot / n


def summary(acc):
    out = []
    for kind in ("single", "multi"):
        v = [acc[(kind, d)] for d in DEPTHS if (kind, d) in acc]
        if not v:
            continue
        out.append("%s %.2f [%s]" % (kind, sum(v) / len(v),
                                      " ".join("%.1f" % x for x in v)))
    return "  ".join(out) + "  answer tokens %.2f" % acc.get("digits", 0.0)


# ---------------------------------------------------------------- checkpoint
def save_ckpt(model, opt, step, elapsed, history):
    os.makedirs(STATE_DIR, exist_ok=True)
    tmp = CKPT + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                "elapsed": elapsed, "history": history, "threads": THREADS}, tmp)
    os.replace(tmp, CKPT)


def load_ckpt(model, opt):
    if not os.path.exists(CKPT):
        return 0, 0.0, []
    st = torch.load(CKPT)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    return st["step"], st["elapsed"], st["history"]


# ---------------------------------------------------------------- export
def export(model, path):
    """llama2.c legacy checkpoint, written by the prose script at our shape."""
    make_model()
    prose.export(model, path)


NEEDLE_LENGTHS = (1024, 2048)
NEEDLE_PER_CELL = 10
NEEDLE_STATE = 77                # the committed cases do not depend on the training seed


def needle_files(corpus):
    """needle_single.tsv and needle_multi.tsv: depth TAB answer TAB prompt,
    NEEDLE_PER_CELL cases per depth and context length, in held-out prose.
    Each prompt, encoded as a C program encodes it (BOS, dummy-prefix space,
    greedy merges), is the token list the cases were built from."""
    for kind in ("single", "multi"):
        path = os.path.join(HERE, "needle_%s.tsv" % kind)
        n = 0
        with open(path + ".tmp", "w") as f:
            for T in NEEDLE_LENGTHS:
                for kd, d, k, ids, text in file_cases(corpus, T, kind):
                    assert "\t" not in text and "\n" not in text
                    assert corpus.tok.encode(text[1:]) == ids, "piecewise encoding differs"
                    f.write("%g\t%s\t%s\n" % (d, k, text[1:]))
                    n += 1
        os.replace(path + ".tmp", path)
        log("wrote %s: %d cases" % (os.path.basename(path), n))


def file_cases(corpus, T, kind):
    """The committed needle cases of one kind and context length: prompts of
    T - 8 tokens at most, so that the answer fits in T."""
    rng = np.random.default_rng([NEEDLE_STATE, T, 1 if kind == "single" else 2])
    out = []
    for d in DEPTHS:
        for _ in range(NEEDLE_PER_CELL):
            names = list(rng.choice(NAMES, 4, replace=False))
            keys = [digits(rng) for _ in names]
            if kind == "single":
                text, ids, _ = haystack(corpus, rng, T - 8, [single_needle(keys[0])],
                                     SINGLE_QUESTION, corpus.held_sents, depths=[d])
            else:
                dep = [d] + [float(x) for x in rng.random(3)]
                text, ids, _ = haystack(corpus, rng, T - 8,
                                        [named_needle(a, b) for a, b in zip(names, keys)],
                                     named_question(names[0]), corpus.held_sents, depths=dep)
            out.append((kind, d, keys[0], ids, text))
    return out


REF_SENTENCE = ("The pass key of Jacob is 40517. And it came to pass, when the king heard "
                "the words of the law, that he rent his clothes. What is the pass key of "
                "Jacob? The pass key of Jacob is")


def write_ref_logits(corpus, model_path):
    """ref_logits.txt: float64 logits of a fixed prompt from the float32
    weights of model.bin, by the prose script's independent numpy decoder
    (token by token with a KV cache), checked against this script's model."""
    ids = corpus.tok.encode(REF_SENTENCE)
    W = prose.load_bin_numpy(model_path)
    ref = prose.numpy_forward(W, ids)
    m = make_model().double()
    prose.load_into_torch(m, W)
    with torch.no_grad():
        tl = m(torch.tensor([ids]))[0].numpy()
    err = float(np.abs(tl - ref).max())
    log("ref logits: %d positions, numpy decode against torch prefill (float64): max |diff| %.3g"
        % (len(ids), err))
    assert err < 1e-9, err
    with open(os.path.join(HERE, "ref_logits.txt"), "w") as f:
        f.write("# line 2: prompt token ids (BOS + encode of %r); then one line per position: "
                "the %d logits computed in float64 from the float32 weights of model.bin, %%.9g\n"
                % (REF_SENTENCE, VOCAB_SIZE))
        f.write(" ".join(map(str, ids)) + "\n")
        for row in ref:
            f.write(" ".join("%.9g" % v for v in row) + "\n")


def eval_files(corpus):
    """heldout.ids (the held-out books, for the loss and KL of kvattn_bench quality --parts model)
    and calib.txt (training prose to calibrate FP8 scales on)."""
    with open(os.path.join(HERE, "heldout.ids"), "w") as f:
        f.write(" ".join(map(str, corpus.held_ids)) + "\n")
    with open(os.path.join(HERE, "calib.txt"), "w") as f:
        f.write(corpus.calib_text)
    log("wrote heldout.ids (%d tokens) and calib.txt" % len(corpus.held_ids))


def load_trained():
    model = make_model()
    st = torch.load(CKPT)
    model.load_state_dict(st["model"])
    log("checkpoint: step %d, %.1f min of training on %d threads"
        % (st["step"], st["elapsed"] / 60, st["threads"]))
    return model, st


def evaluate(corpus, model):
    """The figures of README.md: held-out loss over 2,048-token windows and
    retrieval on the committed needle cases (teacher-forced exact match)."""
    hl = heldout_loss(model, corpus.held_ids, SEQ_LEN, 1000)
    log("held-out loss %.4f nats/token (perplexity %.2f), 2,048-token windows" % (hl, math.exp(hl)))
    for T in NEEDLE_LENGTHS:
        for kind in ("single", "multi"):
            cases = [c[:4] for c in file_cases(corpus, T, kind)]
            log("needle %s T=%d: %s" % (kind, T, summary(retrieval_accuracy(model, corpus, cases))))


# ---------------------------------------------------------------- resume check
def check_resume():
    """Train a tiny model of the same code twice, once stopped inside phase 1
    and resumed from its checkpoint: the weights must be equal bit for bit."""
    import shutil
    import tempfile
    global DIM, N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_SIZE, HIDDEN, PHASES, STAGES
    global EVAL_EVERY, DECAY_STEPS, CKPT_MINUTES, STATE_DIR, CKPT
    DIM, N_LAYERS, N_HEADS, N_KV_HEADS, HIDDEN = 64, 2, 2, 1, 64
    HEAD_SIZE = DIM // N_HEADS
    PHASES = [(8, 64, 2, 0.5, 0.3), (8, 128, 2, 0.3, 0.5)]
    STAGES = [(0, 0, 3, 2e-3, 2e-4), (1, 1, 2, 1e-3, 1e-4)]
    EVAL_EVERY, DECAY_STEPS, CKPT_MINUTES = 1000, 4, 0
    save = save_ckpt
    final = []
    for stop_at in (None, 13):
        STATE_DIR = tempfile.mkdtemp()
        CKPT = os.path.join(STATE_DIR, "ckpt.pt")

        def stopping_save(model, opt, step, *rest):
            save(model, opt, step, *rest)
            if step == stop_at:
                raise KeyboardInterrupt
        globals()["save_ckpt"] = stopping_save
        try:
            train()
        except KeyboardInterrupt:
            log("stopped at step %d; resuming" % stop_at)
            train()
        final.append(torch.load(CKPT))
        shutil.rmtree(STATE_DIR)
    globals()["save_ckpt"] = save
    a, b = final
    same = a["step"] == b["step"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    log("resume check: %s (%d steps)" % ("bit-identical" if same else "DIFFERENT", a["step"]))
    return same


# ---------------------------------------------------------------- data check
def check_data():
    """Every retrieval source the auxiliary loss points at holds the token
    its position is to predict (a few batches of every phase)."""
    corpus = Corpus()
    ok = True
    for p in PHASES:
        good = total = 0
        for step in range(1, 11):
            x, y, _, src = batch(corpus, step, p)
            for i in range(MAX_SOURCES):
                b, t = (src[..., i] >= 0).nonzero(as_tuple=True)
                good += int((x[b, src[b, t, i]] == y[b, t]).sum())
                total += len(b)
        log("T=%d: %d of %d retrieval sources hold the token to predict" % (p[1], good, total))
        ok &= good == total and total > 0
    return ok


# ---------------------------------------------------------------- main
def train(probe=False):
    torch.manual_seed(RANDOM_STATE)
    corpus = Corpus()
    model = make_model()
    opt = make_optimizer(model)
    log("model: dim %d hidden %d layers %d heads %d kv heads %d head size %d vocab %d seq %d: "
        "%d params; %d threads" % (DIM, HIDDEN, N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_SIZE,
                                   VOCAB_SIZE, SEQ_LEN, sum(p.numel() for p in model.parameters()),
                                   THREADS))
    if probe:
        for p in PHASES:
            t0 = time.time()
            for s in range(1, 4):
                loss, _ = step_loss(model, batch(corpus, s, p))
                opt.zero_grad()
                loss.backward()
            log("phase T=%d B=%d: %.2f s/step" % (p[1], p[2], (time.time() - t0) / 3))
        log("retrieval %s" % summary(retrieval_accuracy(model, corpus, eval_cases(corpus, 128, 1, 5))))
        return
    step, elapsed, history = load_ckpt(model, opt)
    if step:
        log("resumed at step %d (%.1f min trained so far)" % (step, elapsed / 60))
    evals = {p[1]: eval_cases(corpus, p[1], 4, 100 + p[1]) for p in PHASES}
    t_last = time.time()
    t_ckpt = time.time()
    ema = None
    while step < total_steps():
        step += 1
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, parts = step_loss(model, batch(corpus, step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        now = time.time()
        elapsed += now - t_last
        t_last = now
        ema = parts[0] if ema is None else 0.95 * ema + 0.05 * parts[0]
        T = phase_of(step)[1]
        if step % 10 == 0:
            log("step %d/%d T=%d loss %.4f (ema %.4f) aux prev %.3f retrieve %.3f copy %.3f "
                "lr %.2e trained %.1f min" % ((step, total_steps(), T, parts[0], ema) + tuple(parts[1:])
                                              + (lr, elapsed / 60)))
        t_ev = time.time()
        if step % EVAL_EVERY == 0 or step == total_steps():
            acc = retrieval_accuracy(model, corpus, evals[T])
            hl = heldout_loss(model, corpus.held_ids, T, 4 * 2048 // T)
            history.append((step, T, hl, acc))
            log("eval step %d T=%d: held-out loss %.4f  %s" % (step, T, hl, summary(acc)))
        t_last += time.time() - t_ev          # evaluation is not training time
        if time.time() - t_ckpt > CKPT_MINUTES * 60 or step == total_steps():
            save_ckpt(model, opt, step, elapsed, history)
            t_ckpt = time.time()
            log("checkpoint at step %d" % step)
    log("done: %d steps, %.1f min of training on %d threads" % (step, elapsed / 60, THREADS))


def step_loss(model, b):
    """The training loss of one batch: weighted cross-entropy plus the
    auxiliary losses.  Returns (loss, [cross-entropy, prev, retrieve, copy])."""
    x, y, w, src = b
    taps = {}
    logits = model(x, taps)
    ce = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), y.reshape(-1), reduction="none")
    main = (ce * w.reshape(-1)).sum() / w.sum()
    # previous-token head: attention of position t to t - 1
    att0 = taps["att"][0][:, 0]
    prev = -att0[:, 1:, :].diagonal(dim1=-2, dim2=-1).clamp_min(1e-9).log().mean()
    loss = main + AUX_PREV * prev
    retrieve = copy = torch.zeros(())
    sel = src[..., 0] >= 0
    if sel.any():
        att = taps["att"][-1][:, 0]
        p = (att.gather(2, src.clamp_min(0)) * (src >= 0)).sum(-1)[sel]
        retrieve = -p.clamp_min(1e-9).log().mean()
        head = taps["out"][-1][:, 0][sel] @ model.layers[-1].wo.weight[:, :HEAD_SIZE].t()
        head_logits = prose.rmsnorm(head, model.norm) @ model.emb.weight.t()
        copy = F.cross_entropy(head_logits, y[sel])
        loss = loss + AUX_RETRIEVE * retrieve + AUX_COPY * copy
    return loss, [main.item(), prev.item(), retrieve.item(), copy.item()]

if __name__ == "__main__":
    if "--eval" in sys.argv or "--export" in sys.argv:
        corpus = Corpus()
        model, _ = load_trained()
        if "--export" in sys.argv:
            export(model, os.path.join(HERE, "model.bin"))
            write_ref_logits(corpus, os.path.join(HERE, "model.bin"))
            needle_files(corpus)
            eval_files(corpus)
        evaluate(corpus, model)
    elif "--check-resume" in sys.argv:
        sys.exit(0 if check_resume() else 1)
    elif "--check-data" in sys.argv:
        sys.exit(0 if check_data() else 1)
    else:
        train(probe="--probe" in sys.argv)
