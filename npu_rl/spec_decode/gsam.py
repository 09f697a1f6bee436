"""Generalized suffix automaton over many token streams growing at once (issue 20): one per prompt.

One :class:`GroupAutomaton` holds every text of one prompt: the running requests (prompt + output so
far, each a *stream*, grown one token at a time as the engine samples it, interleaved with its
siblings), the finished ones, and the prompt's history (earlier rounds' responses, inserted as
streams too). A request's draft continues the longest suffix of its own stream that occurs anywhere
in the group (its own earlier text, a live sibling, a finished sibling, history), so there is no
separate group corpus, no resync and no bulk insert at finish: finishing a request only closes its
stream. Sources: the online generalized suffix automaton (Blumer et al. 1987; the "transition
already exists" case as in the competitive-programming references), SAM Decoding (Hu et al., ACL
2025) for drafting from the longest match.

Why the interleaving is exact: a stream's ``last`` state always has the stream's whole text as its
longest string (a clone takes the shorter strings of a state, never its longest), so every stream
can be extended from its own ``last`` at any time; each extension adds the string ``text + c`` to
the set, which is what the single-string construction does for one text.

Layout (one int32 arena, offsets in the int64 ``meta``; grows by doubling):

- ``TEXT``: token slots in chunks of :data:`CHUNK`; a stream owns a chain of chunks (``NEXTCH``), a
  global position is ``chunk * CHUNK + offset``; unwritten slots hold -1, which ends a draft;
- per state ``LEN, LINK, RECENT, FIRST, HEAD``; per edge ``SRC, TOK, DST, NEXT``; ``HASH`` (linear
  probing, load <= 3/4) from (state, token) to edge + 1 (0 = empty).

Per stream, an int64 ``ctl`` array (:func:`new_stream`) holds its ``last`` state, its last written
position, its current match and the adaptive draft length (TCP-like: +1 after a fully accepted
draft of the current length, halved after a miss, within [1, k_max]), with the last draft kept to
score the next step's tokens against.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["CHUNK", "GroupAutomaton", "new_stream"]

CHUNK = 64  # tokens per text chunk (a stream wastes < CHUNK slots at its end)
RECENT_WALK = 8
_MIN_CAP = 256

_HASH_A = np.uint64(0x9E3779B97F4A7C15)
_HASH_B = np.uint64(0xC2B2AE3D27D4EB4F)

# meta fields
N_CHUNKS, N_STATES, N_EDGES, NEED_E, DONE, GEN, N_TOKENS = range(7)
CT, CS, CE, CH = range(7, 11)
O_NEXTCH, O_LEN, O_LINK, O_RECENT, O_FIRST, O_HEAD, O_SRC, O_TOK, O_DST, O_NEXT, O_HASH = range(11, 22)
_META = 22
_STATE_ROWS = (O_LEN, O_LINK, O_RECENT, O_FIRST, O_HEAD)
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
) = range(17)
_CTL = 17  # the last draft follows (S_KMAX slots)


@njit(cache=True, inline="always")
def _slot(state, tok, mask):
    h = np.uint64(state) * _HASH_A ^ (np.uint64(np.int64(tok) & 0xFFFFFFFF) * _HASH_B)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def _find(a, m, state, tok):
    mask = m[CH] - 1
    oh, osrc, otok = m[O_HASH], m[O_SRC], m[O_TOK]
    i = _slot(state, tok, mask)
    while True:
        e = a[oh + i] - 1
        if e < 0:
            return -1
        if a[osrc + e] == state and a[otok + e] == tok:
            return e
        i = (i + 1) & mask


@njit(cache=True)
def _add_edge(a, m, state, tok, dst):
    e = m[N_EDGES]
    m[N_EDGES] = e + 1
    a[m[O_SRC] + e] = state
    a[m[O_TOK] + e] = tok
    a[m[O_DST] + e] = dst
    a[m[O_NEXT] + e] = a[m[O_HEAD] + state]
    a[m[O_HEAD] + state] = e
    mask = m[CH] - 1
    oh = m[O_HASH]
    i = _slot(state, tok, mask)
    while a[oh + i] != 0:
        i = (i + 1) & mask
    a[oh + i] = e + 1


@njit(cache=True)
def _new_state(a, m, length, link, pos):
    s = m[N_STATES]
    m[N_STATES] = s + 1
    a[m[O_LEN] + s] = length
    a[m[O_LINK] + s] = link
    a[m[O_RECENT] + s] = pos
    a[m[O_FIRST] + s] = pos
    a[m[O_HEAD] + s] = -1
    return s


@njit(cache=True)
def _clone(a, m, p, q, c):
    """Split q: a clone with len(p) + 1 takes q's shorter strings; redirect p's chain from q."""
    cl = _new_state(a, m, a[m[O_LEN] + p] + 1, a[m[O_LINK] + q], a[m[O_FIRST] + q])
    a[m[O_RECENT] + cl] = a[m[O_RECENT] + q]
    eq = a[m[O_HEAD] + q]
    while eq >= 0:
        _add_edge(a, m, cl, a[m[O_TOK] + eq], a[m[O_DST] + eq])
        eq = a[m[O_NEXT] + eq]
    odst, olk = m[O_DST], m[O_LINK]
    while p >= 0:
        e = _find(a, m, p, c)
        if e < 0 or a[odst + e] != q:
            break
        a[odst + e] = cl
        p = a[olk + p]
    a[olk + q] = cl
    return cl


@njit(cache=True)
def _degree(a, m, s):
    d = 0
    e = a[m[O_HEAD] + s]
    while e >= 0:
        d += 1
        e = a[m[O_NEXT] + e]
    return d


@njit(cache=True)
def _extend(new, a, m, st):
    """Append ``new`` to stream ``st``; stop early when the arena is full (m[DONE] = tokens appended)."""
    olen, olk, orec = m[O_LEN], m[O_LINK], m[O_RECENT]
    done = 0
    for j in range(new.shape[0]):
        c = new[j]
        last = st[S_LAST]
        # exact need first: states, edges, a chunk
        add_e = 0
        add_s = 1
        e = _find(a, m, last, c)
        if e >= 0:
            q = a[m[O_DST] + e]
            if a[olen + last] + 1 == a[olen + q]:
                add_s = 0
            else:
                add_e = _degree(a, m, q)
        else:
            p = last
            while p >= 0:
                e = _find(a, m, p, c)
                if e >= 0:
                    break
                add_e += 1
                p = a[olk + p]
            if p >= 0:
                q = a[m[O_DST] + e]
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
            or 4 * (m[N_EDGES] + add_e) > 3 * m[CH]
            or (need_chunk and m[N_CHUNKS] + 1 > m[CT] // CHUNK)
        ):
            m[NEED_E] = add_e
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
        e = _find(a, m, last, c)
        if e >= 0:  # the stream's new text already occurs in the group
            q = a[m[O_DST] + e]
            if a[olen + last] + 1 == a[olen + q]:
                cur = q
            else:
                cur = _clone(a, m, last, q, c)
            match = cur
        else:
            cur = _new_state(a, m, a[olen + last] + 1, 0, i)
            p = last
            while p >= 0:
                e = _find(a, m, p, c)
                if e >= 0:
                    break
                _add_edge(a, m, p, c, cur)
                p = a[olk + p]
            if p >= 0:
                q = a[m[O_DST] + e]
                if a[olen + p] + 1 == a[olen + q]:
                    a[olk + cur] = q
                else:
                    a[olk + cur] = _clone(a, m, p, q, c)
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
        while s > 0 and k < RECENT_WALK:
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
def _step(new, a, m, st, out, kcap):
    """Score the last draft, append ``new`` to stream ``st``, write a draft of at most
    ``min(S_KCUR, kcap)`` tokens; -1 when the arena must grow first (``m[DONE]`` appended)."""
    if st[S_NDRAFT] > 0:
        _score(new, st)
    _extend(new, a, m, st)
    if m[DONE] < new.shape[0]:
        return -1
    k = min(st[S_KCUR], kcap, out.shape[0])
    if k <= 0 or st[S_MLEN] < max(st[S_MIN], 1):
        return 0
    first, second = (st[S_MFIRST], st[S_MPOS]) if st[S_OCC] else (st[S_MPOS], st[S_MFIRST])
    n = _continuation(a, m, first, st[S_POS], k, out)
    if n == 0 and second != first:  # e.g. the recent occurrence is a live sibling's last token
        n = _continuation(a, m, second, st[S_POS], k, out)
    if n > 0:
        st[S_NDRAFT] = n
        st[S_DRAFTED] += n
        st[S_STEPS] += 1
        for j in range(n):
            st[_CTL + j] = out[j]
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


@njit(cache=True)
def _rehash(a, m):
    mask = m[CH] - 1
    oh, osrc, otok = m[O_HASH], m[O_SRC], m[O_TOK]
    for i in range(m[CH]):
        a[oh + i] = 0
    for e in range(m[N_EDGES]):
        i = _slot(a[osrc + e], a[otok + e], mask)
        while a[oh + i] != 0:
            i = (i + 1) & mask
        a[oh + i] = e + 1


def _layout(m: np.ndarray, ct: int, cs: int, ce: int, ch: int) -> int:
    m[CT], m[CS], m[CE], m[CH] = ct, cs, ce, ch
    off = ct
    m[O_NEXTCH] = off
    off += ct // CHUNK
    for row in _STATE_ROWS:
        m[row] = off
        off += cs
    for row in _EDGE_ROWS:
        m[row] = off
        off += ce
    m[O_HASH] = off
    return off + ch


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()


def new_stream(
    k_max: int, min_match: int = 1, adaptive: bool = False, num_prompt: int = 0, occurrence: str = "recent"
) -> np.ndarray:
    """A stream's ctl array: draft length ``k_max`` (>= 0; adaptive: start there, move within
    [1, k_max]), shortest drafting match ``min_match`` (>= 1), ``num_prompt`` prompt tokens,
    ``occurrence`` ("recent" or "first": which earlier occurrence a draft continues)."""
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
    return st


class GroupAutomaton:
    """The generalized suffix automaton of one prompt's streams (see the module docstring).

    ``capacity``: initial token capacity (doubles on demand). Memory: :attr:`nbytes` (allocated),
    :attr:`used_bytes`, :meth:`bytes_per_token`. Token ids must be >= 0 and fit int32.
    """

    def __init__(self, capacity: int = _MIN_CAP):
        cap = max(_pow2(int(capacity)), _MIN_CAP)
        self.meta = np.zeros(_META, np.int64)
        # typical text: ~1.5 states and ~2.3 edges per token; both grow exactly on demand
        size = _layout(self.meta, cap, 2 * cap, 3 * cap, _pow2(4 * cap))
        self.arena = np.zeros(size, np.int32)
        m, a = self.meta, self.arena
        a[m[O_LEN]] = 0
        a[m[O_LINK]] = -1
        a[m[O_RECENT]] = a[m[O_FIRST]] = -1
        a[m[O_HEAD]] = -1
        m[N_STATES] = 1
        self.grows = 0

    def _grow(self) -> None:
        old_a, old_m = self.arena, self.meta.copy()
        ct, cs, ce, ch = (int(old_m[i]) for i in (CT, CS, CE, CH))
        n_ch, n_s, n_e = int(old_m[N_CHUNKS]), int(old_m[N_STATES]), int(old_m[N_EDGES])
        need_e = n_e + int(old_m[NEED_E])
        if n_ch + 1 > ct // CHUNK:
            ct *= 2
        if n_s + 2 > cs:
            cs *= 2
        if need_e > ce:
            ce = max(2 * ce, need_e)
        rehash = 4 * need_e > 3 * ch
        if rehash:
            ch = _pow2(max(2 * ch, 2 * need_e))
        m = self.meta
        a = np.empty(_layout(m, ct, cs, ce, ch), np.int32)
        a[: n_ch * CHUNK] = old_a[: n_ch * CHUNK]
        a[m[O_NEXTCH] : m[O_NEXTCH] + n_ch] = old_a[old_m[O_NEXTCH] : old_m[O_NEXTCH] + n_ch]
        for row in _STATE_ROWS:
            a[m[row] : m[row] + n_s] = old_a[old_m[row] : old_m[row] + n_s]
        for row in _EDGE_ROWS:
            a[m[row] : m[row] + n_e] = old_a[old_m[row] : old_m[row] + n_e]
        if rehash:
            _rehash(a, m)
        else:
            a[m[O_HASH] :] = old_a[old_m[O_HASH] :]
        self.arena = a
        self.grows += 1

    def step(self, st: np.ndarray, new: np.ndarray, out: np.ndarray, kcap: int) -> int:
        """Append ``new`` (contiguous int32, ids >= 0) to stream ``st``; write a draft of at most
        ``min(adaptive k, kcap, len(out))`` tokens into ``out``; return its length."""
        while True:
            r = _step(new, self.arena, self.meta, st, out, kcap)
            if r >= 0:
                return r
            new = new[int(self.meta[DONE]) :]
            self._grow()

    def append(self, st: np.ndarray, tokens) -> None:
        """Append tokens to stream ``st`` without drafting."""
        new = np.ascontiguousarray(tokens, dtype=np.int32)
        self.step(st, new, _NO_OUT, 0)

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
        return int(self.meta[N_EDGES])

    @property
    def generation(self) -> int:
        return int(self.meta[GEN])

    @property
    def nbytes(self) -> int:
        """Bytes allocated (arena and meta)."""
        return self.arena.nbytes + self.meta.nbytes

    @property
    def used_bytes(self) -> int:
        """Bytes in use: text chunks, states, edges and the hash table at its current size."""
        m = self.meta
        n_ch = int(m[N_CHUNKS])
        return 4 * (n_ch * (CHUNK + 1) + 5 * int(m[N_STATES]) + 4 * int(m[N_EDGES]) + int(m[CH]))

    def bytes_per_token(self) -> float:
        """Allocated bytes per token inserted (inf when empty)."""
        n = self.num_tokens
        return self.nbytes / n if n else float("inf")


_NO_OUT = np.empty(0, np.int32)
