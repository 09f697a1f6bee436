"""Generalized suffix automaton over many token streams growing at once (issue 20): one per prompt.

One :class:`GroupAutomaton` holds every text of one prompt: the running requests (prompt + output so
far, each a *stream*, grown one token at a time as the engine samples it, interleaved with its
siblings) and the finished ones. A request's draft continues the longest suffix of its own stream
that occurs anywhere in the group (its own earlier text, a live sibling, a finished sibling) or in
the prompt's read-only history automaton (see below), so there is no
separate group corpus, no resync and no bulk insert at finish: finishing a request only closes its
stream. Sources: the online generalized suffix automaton (Blumer et al. 1987; the "transition
already exists" case as in the competitive-programming references), SAM Decoding (Hu et al., ACL
2025) for drafting from the longest match.

Why the interleaving is exact: a stream's ``last`` state always has the stream's whole text as its
longest string (a clone takes the shorter strings of a state, never its longest), so every stream
can be extended from its own ``last`` at any time; each extension adds the string ``text + c`` to
the set, which is what the single-string construction does for one text.

Layout (one int32 arena, offsets in the int64 ``meta``, reserved as zero pages so that it is
committed only as written and never copied below ``reserve_tokens``; past that it doubles):

- ``TEXT``: token slots in chunks of :data:`CHUNK`; a stream owns a chain of chunks (``NEXTCH``), a
  global position is ``chunk * CHUNK + offset``; unwritten slots hold -1, which ends a draft;
- per state ``LEN, LINK, RECENT, FIRST, X, HEAD``; per edge ``SRC, TOK, DST, NEXT``;
- the hash table (a separate array; linear probing, load <= 3/4) from (state, token) to edge + 1
  (0 = empty); it grows by incremental migration (:data:`MIGRATE_PER_EDGE`), never in one stall.

Implicit edges: every string of a state occurs ending at its FIRST position, so the state has a
transition on the token written after it (:func:`_itok`). That transition keeps only its target, in
``X``, with no edge row and no hash slot; the other transitions are hashed. An edge added while the
state's implicit token is still unwritten (a live sibling's last token) stays hashed, so a lookup
(:func:`_goto`) takes ``X`` when the token is the implicit one and ``X`` is set, else the hash.
Measured (bench_sam_history.py ``--sections steps``, Qwen3 tokens): 1.20 states and 1.42 transitions
per token on MATH maj8 groups, 0.22 of them hashed; 1.52 and 2.01 on Sky-T1 long-CoT groups, 0.49
hashed. Memory in use: 39 B per token on MATH, 53 B on Sky-T1 (all edges hashed: 65 and 90 B; the
issue-6 layout: 92-93 B in use, 121-127 B allocated). RECENT is the latest occurrence; when its
continuation is still unwritten (a live sibling's last token), the draft falls back to FIRST.

History (earlier rounds' responses of the prompt) is not inserted here: it comes as a read-only,
frozen :class:`~npu_rl.spec_decode.sam.SuffixAutomaton` built off the engine step
(:class:`~npu_rl.spec_decode.corpus.SamDrafter`), and each stream keeps a second running match
against it (:func:`attach_history`, advanced in the same fused :func:`_step`); the longer of the
group match and the history match drafts, ties to the group.

Per stream, an int64 ``ctl`` array (:func:`new_stream`) holds its ``last`` state, its last written
position, its current match, its history match and the adaptive draft length (TCP-like: +1 after a fully accepted
draft of the current length, halved after a miss, within [1, k_max]), with the last draft kept to
score the next step's tokens against.
"""

from __future__ import annotations

import mmap

import numpy as np
from numba import njit

from npu_rl.spec_decode import sam as _flat
from npu_rl.spec_decode.sam import _continuation as _hcontinuation
from npu_rl.spec_decode.sam import _goto as _hgoto

__all__ = ["CHUNK", "GroupAutomaton", "HISTORY_RESYNC", "attach_history", "new_stream"]

CHUNK = 64  # tokens per text chunk (a stream wastes < CHUNK slots at its end)
HISTORY_RESYNC = 256  # output tokens a running stream is matched over when a history automaton arrives
# the history automaton is a frozen npu_rl.spec_decode.sam.SuffixAutomaton (SuffixAutomaton.freeze):
# its row offsets
_H_NTEXT, _H_LEN, _H_LINK, _H_POS = _flat.N_TEXT, _flat.O_LEN, _flat.O_LINK, _flat.O_POS
RECENT_WALK = 8
_MIN_CAP = 256

_HASH_A = np.uint64(0x9E3779B97F4A7C15)
_HASH_B = np.uint64(0xC2B2AE3D27D4EB4F)

MIGRATE_PER_EDGE = 2  # old hash slots moved to the new table per edge added while the table grows
DEFAULT_RESERVE = 1 << 21  # tokens of address space reserved per group (touched only as used)

# meta fields
N_CHUNKS, N_STATES, N_EDGES, NEED_E, DONE, GEN, N_TOKENS, NEED_H, CHO, MIG = range(10)
CT, CS, CE, CH = range(10, 14)
O_NEXTCH, O_LEN, O_LINK, O_RECENT, O_FIRST, O_HEAD, O_SRC, O_TOK, O_DST, O_NEXT = range(14, 24)
O_X = 24  # per state: target of its implicit edge (-1: none yet), see _itok
N_IMPLICIT = 25  # states whose implicit edge is set (edges = N_EDGES + N_IMPLICIT)
_META = 26
_STATE_ROWS = (O_LEN, O_LINK, O_RECENT, O_FIRST, O_X, O_HEAD)
_EDGE_ROWS = (O_SRC, O_TOK, O_DST, O_NEXT)

# stream ctl fields
(
    S_LAST,  # state whose longest string is the stream's text
    S_POS,  # global position of the stream's last token (-1: empty)
    S_START,  # global position of the first token after the prompt (-1: not yet)
    S_NPROMPT,  # prompt tokens (output starts after them)
    S_NTOK,  # tokens in the stream
    S_MLEN,  # length of the longest suffix that occurs elsewhere in the group
    S_MPOS,  # end position of its most recent earlier occurrence (-1: none)
    S_MFIRST,  # end position of its first occurrence
    S_KMAX,  # engine's draft length
    S_KCUR,  # adaptive draft length (== S_KMAX when not adaptive)
    S_ADAPT,  # 1: adapt S_KCUR
    S_MIN,  # shortest match that drafts
    S_NDRAFT,  # length of the last draft (scored against the next tokens)
    S_DRAFTED,  # counters: draft tokens proposed and accepted over the stream's life
    S_ACCEPTED,
    S_STEPS,  # steps that drafted
    S_OCC,  # 1: continue the first occurrence (else the most recent; the other is the fallback)
    S_WALK,  # suffix links above each new state whose RECENT this stream refreshes
    S_HID,  # id of the history automaton the history match refers to (0: none attached)
    S_HSTATE,  # history match: state of the history automaton and length (see _hadvance)
    S_HLEN,
) = range(21)
_CTL = 21  # the last draft follows (S_KMAX slots)


@njit(cache=True, inline="always")
def _slot(state, tok, mask):
    h = np.uint64(state) * _HASH_A ^ (np.uint64(np.int64(tok) & 0xFFFFFFFF) * _HASH_B)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, inline="always")
def _probe(a, m, h, state, tok):
    mask = h.shape[0] - 1
    osrc, otok = m[O_SRC], m[O_TOK]
    i = _slot(state, tok, mask)
    while True:
        e = h[i] - 1
        if e < 0:
            return -1
        if a[osrc + e] == state and a[otok + e] == tok:
            return e
        i = (i + 1) & mask


@njit(cache=True)
def _find(a, m, h, ho, state, tok):
    """Edge index of (state, tok), or -1 (the old table too while the hash table grows)."""
    e = _probe(a, m, h, state, tok)
    if e < 0 and m[MIG] >= 0:
        e = _probe(a, m, ho, state, tok)
    return e


@njit(cache=True, inline="always")
def _itok(a, m, s):
    """Token of state ``s``'s implicit edge: the one after its first end position (-1: not written yet,
    or the root). Every string of ``s`` occurs ending there, so the edge on that token exists once
    it is written; its target is kept in the state's X row instead of an edge row and a hash slot."""
    f = a[m[O_FIRST] + s]
    if f < 0:
        return -1
    q = f + 1
    if q % CHUNK == 0:
        q = a[m[O_NEXTCH] + f // CHUNK]
        if q < 0:
            return -1
        q *= CHUNK
    return a[q]


@njit(cache=True)
def _goto(a, m, h, ho, s, c):
    """Target of the transition of state ``s`` on token ``c`` (>= 0), or -1: the implicit edge when
    ``c`` is its token and it is set, else the hashed edges (an edge added before its state's
    implicit token was written stays there)."""
    x = a[m[O_X] + s]
    if x >= 0 and _itok(a, m, s) == c:
        return x
    e = _find(a, m, h, ho, s, c)
    return a[m[O_DST] + e] if e >= 0 else -1


@njit(cache=True, inline="always")
def _hash_put(a, m, h, e):
    mask = h.shape[0] - 1
    i = _slot(a[m[O_SRC] + e], a[m[O_TOK] + e], mask)
    while h[i] != 0:
        i = (i + 1) & mask
    h[i] = e + 1


@njit(cache=True)
def _migrate(a, m, h, ho, n):
    """Move ``n`` slots of the old hash table ``ho`` into ``h`` (m[MIG] = -1 once all moved)."""
    i = m[MIG]
    if i < 0:
        return
    end = min(i + n, ho.shape[0])
    while i < end:
        if ho[i] != 0:
            _hash_put(a, m, h, ho[i] - 1)
        i += 1
    m[MIG] = -1 if i >= ho.shape[0] else i


@njit(cache=True)
def _add_edge(a, m, h, ho, state, tok, dst):
    """Add the transition (state, tok) -> dst, which must not exist: as the implicit edge when ``tok``
    is the state's implicit token, else an edge row and a hash slot."""
    if tok >= 0 and a[m[O_X] + state] < 0 and tok == _itok(a, m, state):  # -1 is also "unwritten"
        a[m[O_X] + state] = dst
        m[N_IMPLICIT] += 1
        return
    e = m[N_EDGES]
    m[N_EDGES] = e + 1
    a[m[O_SRC] + e] = state
    a[m[O_TOK] + e] = tok
    a[m[O_DST] + e] = dst
    a[m[O_NEXT] + e] = a[m[O_HEAD] + state]
    a[m[O_HEAD] + state] = e
    _hash_put(a, m, h, e)
    if m[MIG] >= 0:
        _migrate(a, m, h, ho, MIGRATE_PER_EDGE)


@njit(cache=True)
def _new_state(a, m, length, link, pos):
    s = m[N_STATES]
    m[N_STATES] = s + 1
    a[m[O_LEN] + s] = length
    a[m[O_LINK] + s] = link
    a[m[O_RECENT] + s] = pos
    a[m[O_FIRST] + s] = pos
    a[m[O_X] + s] = -1
    a[m[O_HEAD] + s] = -1
    return s


@njit(cache=True)
def _clone(a, m, h, ho, p, q, c):
    """Split q: a clone with len(p) + 1 takes q's shorter strings; redirect p's chain from q."""
    cl = _new_state(a, m, a[m[O_LEN] + p] + 1, a[m[O_LINK] + q], a[m[O_FIRST] + q])
    a[m[O_RECENT] + cl] = a[m[O_RECENT] + q]
    if a[m[O_X] + q] >= 0:  # same first end position, so the same implicit token
        a[m[O_X] + cl] = a[m[O_X] + q]
        m[N_IMPLICIT] += 1
    eq = a[m[O_HEAD] + q]
    while eq >= 0:
        _add_edge(a, m, h, ho, cl, a[m[O_TOK] + eq], a[m[O_DST] + eq])
        eq = a[m[O_NEXT] + eq]
    odst, olk, ox = m[O_DST], m[O_LINK], m[O_X]
    while p >= 0:
        if a[ox + p] >= 0 and _itok(a, m, p) == c:
            if a[ox + p] != q:
                break
            a[ox + p] = cl
        else:
            e = _find(a, m, h, ho, p, c)
            if e < 0 or a[odst + e] != q:
                break
            a[odst + e] = cl
        p = a[olk + p]
    a[olk + q] = cl
    return cl


@njit(cache=True)
def _degree(a, m, s):
    """Edge rows of state ``s`` (its implicit edge has none)."""
    d = 0
    e = a[m[O_HEAD] + s]
    while e >= 0:
        d += 1
        e = a[m[O_NEXT] + e]
    return d


@njit(cache=True)
def _extend(new, a, m, h, ho, st):
    """Append ``new`` to stream ``st``; stop early when the arena is full (m[DONE] = tokens appended)."""
    olen, olk, orec = m[O_LEN], m[O_LINK], m[O_RECENT]
    done = 0
    for j in range(new.shape[0]):
        c = new[j]
        last = st[S_LAST]
        # exact need first: states, edges, a chunk (the walk's end is kept for the extension below)
        add_e = 0
        add_s = 1
        q0 = _goto(a, m, h, ho, last, c)
        p_stop = -1
        q_stop = -1
        if q0 >= 0:
            q = q0
            if a[olen + last] + 1 == a[olen + q]:
                add_s = 0
            else:
                add_e = _degree(a, m, q)
        else:
            p = last
            t = -1
            while p >= 0:
                t = _goto(a, m, h, ho, p, c)
                if t >= 0:
                    break
                add_e += 1
                p = a[olk + p]
            p_stop = p
            q_stop = t
            if p >= 0:
                q = t
                if a[olen + p] + 1 != a[olen + q]:
                    add_s = 2
                    add_e += _degree(a, m, q)
                    s = last
                    while s != p:  # q on the walk gets its edge on c before the clone copies q's edges
                        if s == q:
                            add_e += 1
                            break
                        s = a[olk + s]
        pos = st[S_POS]
        need_chunk = pos < 0 or (pos + 1) % CHUNK == 0
        if (
            m[N_STATES] + add_s > m[CS]
            or m[N_EDGES] + add_e > m[CE]
            or (need_chunk and m[N_CHUNKS] + 1 > m[CT] // CHUNK)
        ):
            m[NEED_E] = add_e
            break
        if 4 * (m[N_EDGES] + add_e) > 3 * h.shape[0]:
            m[NEED_H] = m[N_EDGES] + add_e
            break
        # write the token
        if need_chunk:
            ch = m[N_CHUNKS]
            m[N_CHUNKS] = ch + 1
            a[ch * CHUNK : (ch + 1) * CHUNK] = -1
            a[m[O_NEXTCH] + ch] = -1
            if pos >= 0:
                a[m[O_NEXTCH] + pos // CHUNK] = ch
            i = ch * CHUNK
        else:
            i = pos + 1
        a[i] = c
        st[S_POS] = i
        st[S_NTOK] += 1
        if st[S_START] < 0 and st[S_NTOK] > st[S_NPROMPT]:
            st[S_START] = i
        m[N_TOKENS] += 1
        # extend the automaton
        if q0 >= 0:  # the stream's new text already occurs in the group
            q = q0
            if a[olen + last] + 1 == a[olen + q]:
                cur = q
            else:
                cur = _clone(a, m, h, ho, last, q, c)
            match = cur
        else:
            cur = _new_state(a, m, a[olen + last] + 1, 0, i)
            p = last
            while p != p_stop:  # the states the need pass found without an edge on c
                _add_edge(a, m, h, ho, p, c, cur)
                p = a[olk + p]
            if p >= 0:
                q = q_stop
                if a[olen + p] + 1 == a[olen + q]:
                    a[olk + cur] = q
                else:
                    a[olk + cur] = _clone(a, m, h, ho, p, q, c)
            match = a[olk + cur]
        st[S_LAST] = cur
        if match > 0:
            st[S_MLEN] = a[olen + match] if match != cur else st[S_NTOK]
            st[S_MPOS] = a[orec + match]
            st[S_MFIRST] = a[m[O_FIRST] + match]
        else:
            st[S_MLEN] = 0
            st[S_MPOS] = -1
            st[S_MFIRST] = -1
        s = cur
        k = 0
        while s > 0 and k < st[S_WALK]:
            a[orec + s] = i
            s = a[olk + s]
            k += 1
        done += 1
    m[DONE] = done
    if done:
        m[GEN] += 1


@njit(cache=True)
def _continuation(a, m, pos, own, k, out):
    """Up to ``k`` tokens after global position ``pos`` into ``out``; returns how many.

    Reaching the stream's own last position ``own`` continues periodically (the text repeats with
    the period read so far); an unwritten slot (-1) ends the draft.
    """
    n = 0
    p = pos
    period = 0
    onx = m[O_NEXTCH]
    while n < k:
        if period > 0:
            out[n] = out[n - period]
            n += 1
            continue
        if p == own:
            if n == 0:
                break
            period = n
            continue
        q = p + 1
        if q % CHUNK == 0:
            q = a[onx + p // CHUNK]
            if q < 0:
                break
            q *= CHUNK
        tok = a[q]
        if tok < 0:
            break
        out[n] = tok
        n += 1
        p = q
    return n


@njit(cache=True)
def _score(new, st):
    """Score the last draft against the tokens that followed it; adapt the draft length."""
    nd = st[S_NDRAFT]
    if nd <= 0:
        return
    acc = 0
    while acc < nd and acc < new.shape[0] and new[acc] == st[_CTL + acc]:
        acc += 1
    st[S_ACCEPTED] += acc
    st[S_NDRAFT] = 0
    if st[S_ADAPT] != 0:
        if acc == nd:
            if nd >= st[S_KCUR] and st[S_KCUR] < st[S_KMAX]:
                st[S_KCUR] += 1
        else:
            st[S_KCUR] = max(1, st[S_KCUR] // 2)


@njit(cache=True)
def _hadvance(new, ha, hm, st):
    """Feed ``new`` to the stream's running match against the read-only history automaton (ha, hm).

    The same walk as :func:`npu_rl.spec_decode.sam._advance`: extend on an edge, else fall back along
    suffix links keeping the length while the link's strings are longer (the automaton never grows
    while attached, so the match stays exact).
    """
    s = st[S_HSTATE]
    ln = st[S_HLEN]
    for j in range(new.shape[0]):
        c = new[j]
        while True:
            t = _hgoto(ha, hm, s, c)
            if t >= 0:
                s = t
                ln += 1
                break
            if s == 0:
                ln = 0
                break
            s = ha[hm[_H_LINK] + s]
            ln = min(ln, ha[hm[_H_LEN] + s])
    st[S_HSTATE] = s
    st[S_HLEN] = ln


@njit(cache=True)
def attach_history(st, recent, ha, hm, hid):
    """Point stream ``st`` at history automaton ``hid`` (ha, hm; a frozen
    :class:`~npu_rl.spec_decode.sam.SuffixAutomaton`, as ``corpus.build_history`` makes it, since a draft
    reads its one end position per state): its match is redone over ``recent``
    (the stream's last output tokens, at most :data:`HISTORY_RESYNC`)."""
    st[S_HID] = hid
    st[S_HSTATE] = 0
    st[S_HLEN] = 0
    if hid > 0:
        _hadvance(recent, ha, hm, st)


@njit(cache=True)
def _keep_draft(st, out, n):
    st[S_NDRAFT] = n
    st[S_DRAFTED] += n
    st[S_STEPS] += 1
    for j in range(n):
        st[_CTL + j] = out[j]


@njit(cache=True)
def _step(new, a, m, h, ho, st, out, kcap, ha, hm):
    """Score the last draft, append ``new`` to stream ``st``, write a draft of at most
    ``min(S_KCUR, kcap)`` tokens; -1 when the arena must grow first (``m[DONE]`` appended).

    With a history automaton attached (``st[S_HID] > 0``; (ha, hm) is it), the appended tokens also
    advance the history match, and a history match longer than the group match drafts from the
    history text (a group match at least as long drafts from the group: own text, live and finished
    siblings). The history match covers exactly the tokens appended, also when this returns -1.
    """
    if st[S_NDRAFT] > 0 and new.shape[0] > 0:  # an empty feed (a re-propose) scores nothing
        _score(new, st)
    _extend(new, a, m, h, ho, st)
    if st[S_HID] > 0:
        _hadvance(new[: m[DONE]], ha, hm, st)
    if m[DONE] < new.shape[0]:
        return -1
    k = min(st[S_KCUR], kcap, out.shape[0])
    if k <= 0:
        return 0
    lo = max(st[S_MIN], 1)
    if st[S_HID] > 0 and st[S_HLEN] > st[S_MLEN] and st[S_HLEN] >= lo:
        # the state's one end position: the preferred occurrence unless no real token follows it (the
        # frozen layout chose it, with the fallback to the other occurrence)
        n = _hcontinuation(ha, hm[_H_NTEXT], ha[hm[_H_POS] + st[S_HSTATE]], 0, k, out)
        if n > 0:
            _keep_draft(st, out, n)
            return n
    if st[S_MLEN] < lo:
        return 0
    first, second = (st[S_MFIRST], st[S_MPOS]) if st[S_OCC] else (st[S_MPOS], st[S_MFIRST])
    n = _continuation(a, m, first, st[S_POS], k, out)
    if n == 0 and second != first:  # e.g. the recent occurrence is a live sibling's last token
        n = _continuation(a, m, second, st[S_POS], k, out)
    if n > 0:
        _keep_draft(st, out, n)
    return n


@njit(cache=True)
def _read(a, m, start, last, out):
    """Copy a stream's tokens from global position ``start`` through ``last`` into ``out``; count."""
    n = 0
    p = start
    onx = m[O_NEXTCH]
    while p >= 0 and n < out.shape[0]:
        out[n] = a[p]
        n += 1
        if p == last:
            break
        q = p + 1
        if q % CHUNK == 0:
            q = a[onx + p // CHUNK]
            if q < 0:
                break
            q *= CHUNK
        p = q
    return n


def _layout(m: np.ndarray, ct: int, cs: int, ce: int, ch: int) -> int:
    m[CT], m[CS], m[CE], m[CH] = ct, cs, ce, ch  # CH: the hash table's size (a separate array)
    off = ct
    m[O_NEXTCH] = off
    off += ct // CHUNK
    for row in _STATE_ROWS:
        m[row] = off
        off += cs
    for row in _EDGE_ROWS:
        m[row] = off
        off += ce
    return off


def _reserve(n: int) -> np.ndarray:
    """``n`` int32 zeros as an anonymous mapping: pages are committed when first written (numpy's
    own large allocations ask for huge pages, which commits 2 MiB per touched region)."""
    buf = mmap.mmap(-1, 4 * n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.int32)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()


def new_stream(
    k_max: int,
    min_match: int = 1,
    adaptive: bool = False,
    num_prompt: int = 0,
    occurrence: str = "recent",
    recent_walk: int = RECENT_WALK,
) -> np.ndarray:
    """A stream's ctl array: draft length ``k_max`` (>= 0; adaptive: start there, move within
    [1, k_max]), shortest drafting match ``min_match`` (>= 1), ``num_prompt`` prompt tokens,
    ``occurrence`` ("recent" or "first": which earlier occurrence a draft continues), ``recent_walk``:
    suffix links above each new state whose latest occurrence this stream's tokens refresh (a
    history stream passes 0: its text is older than the live streams' anyway, and it saves the
    walk's writes on every history token)."""
    if occurrence not in ("recent", "first"):
        raise ValueError(f"occurrence={occurrence!r}: use 'recent' or 'first'")
    if k_max < 0 or min_match < 1:
        raise ValueError(f"k_max={k_max} must be >= 0 and min_match={min_match} >= 1")
    st = np.zeros(_CTL + max(k_max, 1), np.int64)
    st[S_POS] = st[S_START] = st[S_MPOS] = st[S_MFIRST] = -1
    st[S_NPROMPT] = num_prompt
    st[S_KMAX] = st[S_KCUR] = k_max
    st[S_ADAPT] = int(adaptive)
    st[S_MIN] = min_match
    st[S_OCC] = int(occurrence == "first")
    st[S_WALK] = recent_walk
    return st


class GroupAutomaton:
    """The generalized suffix automaton of one prompt's streams (see the module docstring).

    ``reserve_tokens``: tokens of address space reserved up front (zero pages from the OS: memory is
    committed only as it is written, and no growth copy happens below this size; past it the arena
    doubles, a copy, counted in :attr:`grows`). The hash table is a separate array that grows
    without a stall: a table twice the size is allocated (zero pages) and the old one's slots are
    moved over :data:`MIGRATE_PER_EDGE` per edge added, lookups consult both meanwhile.
    Memory: :attr:`nbytes` (committed: the written part of every region), :meth:`bytes_per_token`.
    Token ids must be >= 0 and fit int32.
    """

    def __init__(self, reserve_tokens: int = DEFAULT_RESERVE):
        cap = max(_pow2(int(reserve_tokens)), _MIN_CAP)
        self.meta = np.zeros(_META, np.int64)
        # a SAM has at most 2n states and 3n edges; text gets room for the chunk tails of many streams
        self.arena = _reserve(_layout(self.meta, cap + 64 * CHUNK, 2 * cap, 3 * cap, 1024))
        self.h = np.zeros(1024, np.int32)
        self.ho = _EMPTY_HASH
        m, a = self.meta, self.arena
        a[m[O_LINK]] = -1
        a[m[O_RECENT]] = a[m[O_FIRST]] = -1
        a[m[O_X]] = a[m[O_HEAD]] = -1
        m[N_STATES] = 1
        m[MIG] = -1
        self.grows = 0
        self.hash_grows = 0

    def _grow(self) -> None:
        m = self.meta
        if m[NEED_H]:
            if m[MIG] >= 0:  # the previous migration must end first (it ends long before, by design)
                _migrate(self.arena, m, self.h, self.ho, self.ho.shape[0])
            self.ho = self.h
            self.h = np.zeros(_pow2(max(2 * self.h.shape[0], 2 * int(m[NEED_H]))), np.int32)
            m[CH], m[CHO], m[MIG], m[NEED_H] = self.h.shape[0], self.ho.shape[0], 0, 0
            self.hash_grows += 1
            return
        old_a, old_m = self.arena, m.copy()
        ct, cs, ce, ch = (int(old_m[i]) for i in (CT, CS, CE, CH))
        n_ch, n_s, n_e = int(old_m[N_CHUNKS]), int(old_m[N_STATES]), int(old_m[N_EDGES])
        need_e = n_e + int(old_m[NEED_E])
        if n_ch + 1 > ct // CHUNK:
            ct *= 2
        if n_s + 2 > cs:
            cs *= 2
        if need_e > ce:
            ce = max(2 * ce, need_e)
        a = _reserve(_layout(m, ct, cs, ce, ch))
        a[: n_ch * CHUNK] = old_a[: n_ch * CHUNK]
        a[m[O_NEXTCH] : m[O_NEXTCH] + n_ch] = old_a[old_m[O_NEXTCH] : old_m[O_NEXTCH] + n_ch]
        for row in _STATE_ROWS:
            a[m[row] : m[row] + n_s] = old_a[old_m[row] : old_m[row] + n_s]
        for row in _EDGE_ROWS:
            a[m[row] : m[row] + n_e] = old_a[old_m[row] : old_m[row] + n_e]
        self.arena = a
        self.grows += 1

    def step(self, st: np.ndarray, new: np.ndarray, out: np.ndarray, kcap: int, hist=None) -> int:
        """Append ``new`` (contiguous int32, ids >= 0) to stream ``st``; write a draft of at most
        ``min(adaptive k, kcap, len(out))`` tokens into ``out``; return its length. ``hist``: the
        read-only history automaton (:class:`~npu_rl.spec_decode.sam.SuffixAutomaton`) the stream is
        attached to (:func:`attach_history`), or None."""
        ha, hm = (NO_HISTORY.arena, NO_HISTORY.meta) if hist is None else (hist.arena, hist.meta)
        while True:
            r = _step(new, self.arena, self.meta, self.h, self.ho, st, out, kcap, ha, hm)
            if r >= 0:
                if self.meta[MIG] < 0 and self.ho.shape[0] > 1:
                    self.release_old_hash()
                return r
            new = new[int(self.meta[DONE]) :]
            self._grow()

    def release_old_hash(self) -> None:
        """Free the old hash table once its migration has ended."""
        self.ho = _EMPTY_HASH

    def append(self, st: np.ndarray, tokens, hist=None) -> None:
        """Append tokens to stream ``st`` without drafting (``hist`` as in :meth:`step`)."""
        new = np.ascontiguousarray(tokens, dtype=np.int32)
        self.step(st, new, _NO_OUT, 0, hist)

    def output(self, st: np.ndarray) -> np.ndarray:
        """The stream's tokens after its prompt (a copy)."""
        n = int(st[S_NTOK] - st[S_NPROMPT])
        out = np.empty(max(n, 0), np.int32)
        if n <= 0 or st[S_START] < 0:
            return out[:0]
        return out[: _read(self.arena, self.meta, st[S_START], st[S_POS], out)]

    @property
    def num_tokens(self) -> int:
        return int(self.meta[N_TOKENS])

    @property
    def num_states(self) -> int:
        return int(self.meta[N_STATES])

    @property
    def num_edges(self) -> int:
        """Transitions: implicit ones (no edge row) plus the hashed ones."""
        return int(self.meta[N_EDGES] + self.meta[N_IMPLICIT])

    @property
    def num_hashed_edges(self) -> int:
        """Transitions with an edge row and a hash slot (not a state's implicit edge)."""
        return int(self.meta[N_EDGES])

    @property
    def generation(self) -> int:
        return int(self.meta[GEN])

    @property
    def nbytes(self) -> int:
        """Bytes committed: the written part of each arena region (plus a page each), the hash tables."""
        return self.used_bytes + 4096 * (1 + len(_STATE_ROWS) + len(_EDGE_ROWS)) + self.meta.nbytes

    @property
    def used_bytes(self) -> int:
        """Bytes in use: text chunks, states, edges, the hash table(s)."""
        m = self.meta
        n_ch = int(m[N_CHUNKS])
        hashes = self.h.nbytes + (self.ho.nbytes if self.ho.shape[0] > 1 else 0)
        rows = len(_STATE_ROWS) * int(m[N_STATES]) + len(_EDGE_ROWS) * int(m[N_EDGES])
        return 4 * (n_ch * (CHUNK + 1) + rows) + hashes

    @property
    def reserved_bytes(self) -> int:
        """Address space reserved (arena, mostly never touched) plus the hash tables."""
        return self.arena.nbytes + self.h.nbytes + self.ho.nbytes

    def bytes_per_token(self) -> float:
        """Committed bytes per token inserted (inf when empty)."""
        n = self.num_tokens
        return self.nbytes / n if n else float("inf")


_NO_OUT = np.empty(0, np.int32)
_EMPTY_HASH = np.zeros(1, np.int32)
NO_HISTORY = _flat.SuffixAutomaton(64)  # passed to _step while no history automaton is attached


def _key_cache_on_sam_source() -> None:
    """numba keys a cached function on its own file's content only, and gsam's compiled functions
    inline sam.py's (``_continuation``, ``_goto``, constants): after an edit to sam.py alone, numba
    would load gsam's stale machine code. Each gsam cache index is therefore stamped with sam.py's
    content too, so such an edit recompiles gsam. Only gsam's own functions: the sam.py ones imported
    here keep sam.py's stamp (a process that imports only sam.py shares their cache). This uses
    numba's cache internals (pinned numba 0.68); where they differ, gsam's functions are compiled
    afresh in every process instead of risking stale code."""
    import hashlib

    from numba.core import caching

    with open(_flat.__file__, "rb") as f:
        sam_digest = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    for fn in list(globals().values()):
        if getattr(getattr(fn, "py_func", None), "__module__", None) != __name__:
            continue  # not a numba dispatcher of this module
        cache = getattr(fn, "_cache", None)
        if cache is None or isinstance(cache, caching.NullCache):
            continue  # not cached
        index = getattr(cache, "_cache_file", None)
        if index is not None and hasattr(index, "_source_stamp"):
            index._source_stamp = (index._source_stamp, sam_digest)
        else:
            cache.disable()


_key_cache_on_sam_source()
