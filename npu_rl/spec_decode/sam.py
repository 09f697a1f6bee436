"""Incremental suffix automaton over token ids, compiled with numba: the SAM drafter's core.

Source: Hu et al., "SAM Decoding: Speculative Decoding via Suffix Automaton" (ACL 2025), with the
textbook online construction (Blumer et al. 1985; the clone step as in every competitive-programming
reference). No vllm / torch / torch_npu imports here: the vLLM adapter lives in
:mod:`npu_rl.spec_decode.vllm_proposer`.

Layout (flat numpy arrays, no per-token Python objects):

one int32 arena holding, at offsets kept in an int64 ``meta`` array,

- ``text``: the token ids appended so far (negative ids are separators that never match a real
  token and stop a draft);
- per state: ``LEN`` (longest string), ``LINK`` (suffix link), ``FIRST`` (end position of the first
  occurrence), ``RECENT`` (end position of a recent occurrence, see below), ``HEAD`` (first edge);
- per edge: ``SRC``, ``TOK``, ``DST``, ``NEXT`` (singly linked list of a state's edges, needed to copy
  a state's transitions when it is cloned);
- ``HASH``: open-addressing hash table (linear probing, power-of-two size, load <= 1/2)
  from (state, token) to edge index. Why a hash table rather than sorted per-state edge arrays: the
  automaton grows one token at a time and a state's edge set changes at random states (the root has
  thousands of edges), so sorted arrays would need O(degree) inserts; the hash gives O(1) lookup and
  insert, and the per-state lists give the clone step its O(degree) enumeration.

One arena (rather than a dozen arrays) keeps the numba call overhead low (each array argument costs
numba's dispatcher ~50-200 ns): one fused call per decode step
(:meth:`SuffixAutomaton.step`) appends the new tokens, advances the group-corpus match and writes the
draft. Every array grows by doubling on demand (checked exactly before each extension: the number of states
and edges an extension adds is computed first), so appends are amortised O(1) per token.

Which occurrence a draft continues from: the longest suffix of the text that occurred before ends at
several earlier positions; ``occurrence="recent"`` continues from a recent one (the latest end
position among the occurrences this automaton saw while the matching state was at most
:data:`RECENT_WALK` suffix links above the newest state, which is the latest one in practice),
``"first"`` from the earliest (exact, what a static SAM gives). Recent text is the better predictor
in reasoning traces (the benchmark measures both: ``benchmarks/bench_sam.py --occurrence``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "RECENT_WALK",
    "RESYNC_TOKENS",
    "SuffixAutomaton",
    "new_ctl",
]

RESYNC_TOKENS = 256  # suffix length re-matched against a group automaton after it grew
RECENT_WALK = 8  # suffix links above a new state whose RECENT position is refreshed per append
_MIN_CAP = 64
_HASH_A = np.uint64(0x9E3779B97F4A7C15)
_HASH_B = np.uint64(0xC2B2AE3D27D4EB4F)

# meta (int64) fields: counters, then capacities, then arena offsets
N_TEXT, N_STATES, N_EDGES, LAST, QPOS, NEED, DONE, WALK, GEN = range(9)
CT, CS, CE, CH = range(9, 13)
O_LEN, O_LINK, O_FIRST, O_RECENT, O_HEAD, O_SRC, O_TOK, O_DST, O_NEXT, O_HASH = range(13, 23)
COMPACT = 23  # 1: the frozen read-only layout (see SuffixAutomaton.freeze); its rows alias the offsets below
_META = 24
# the frozen layout's rows, at the offsets of rows it does not have
O_POS = O_FIRST  # = O_RECENT: one end position per state, the occurrence a draft continues from
O_X, O_XT0, O_XOFF, O_ETOK, O_EDST = O_HEAD, O_SRC, O_NEXT, O_TOK, O_DST
X_NONE = -1  # O_X: the state has no outgoing edge
_STATE_ROWS = (O_LEN, O_LINK, O_FIRST, O_RECENT, O_HEAD)
_EDGE_ROWS = (O_SRC, O_TOK, O_DST, O_NEXT)
# ctl (int64, one per drafting text): the group match, then the draft parameters and the outcome
C_GSTATE, C_GLEN, C_GGEN, C_K, C_MIN, C_GROUP, C_SOURCE, C_MATCH = range(8)
_CTL = 8
SOURCE_NONE, SOURCE_OWN, SOURCE_GROUP = 0, 1, 2


@njit(cache=True, inline="always")
def _slot(state, tok, mask):
    h = np.uint64(state) * _HASH_A ^ (np.uint64(np.int64(tok) & 0xFFFFFFFF) * _HASH_B)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def _find(a, m, state, tok):
    """Edge index of (state, tok), or -1."""
    mask = m[CH] - 1
    oh, osrc, otok = m[O_HASH], m[O_SRC], m[O_TOK]
    i = _slot(state, tok, mask)
    while True:
        e = a[oh + i]
        if e < 0:
            return -1
        if a[osrc + e] == state and a[otok + e] == tok:
            return e
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _goto(a, m, state, tok):
    """Target of the transition (state, tok), or -1; both layouts (growing: hash, frozen: compact)."""
    if m[COMPACT] == 0:
        e = _find(a, m, state, tok)
        return a[m[O_DST] + e] if e >= 0 else -1
    x = a[m[O_X] + state]
    if x == X_NONE:
        return -1
    t0 = x if x >= 0 else a[m[O_XT0] - 2 - x]  # the implicit edge's target (-1: none)
    if t0 >= 0 and a[a[m[O_POS] + state] + 1] == tok:  # the token after the state's end position
        return t0
    if x >= 0:  # no other edge
        return -1
    j = -2 - x
    lo, hi = a[m[O_XOFF] + j], a[m[O_XOFF] + j + 1]  # the other edges, sorted by token
    otok = m[O_ETOK]
    while lo < hi:
        mid = (lo + hi) >> 1
        t = a[otok + mid]
        if t < tok:
            lo = mid + 1
        elif t > tok:
            hi = mid
        else:
            return a[m[O_EDST] + mid]
    return -1


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
    while a[oh + i] >= 0:
        i = (i + 1) & mask
    a[oh + i] = e


@njit(cache=True, nogil=True)  # a history automaton is built on a worker thread (SamDrafter)
def _extend(new, a, m):
    """Append ``new``; stop early when the arena would overflow. m[DONE] = tokens appended."""
    walk = m[WALK]
    oln, olk, ofi, ore, ohd = m[O_LEN], m[O_LINK], m[O_FIRST], m[O_RECENT], m[O_HEAD]
    odst, onx = m[O_DST], m[O_NEXT]
    done = 0
    for j in range(new.shape[0]):
        c = new[j]
        n_text = m[N_TEXT]
        n_states = m[N_STATES]
        last = m[LAST]
        # exact cost of this extension first: edges added by the walk, plus a clone's copied edges
        add_edges = 0
        p = last
        e = -1
        while p >= 0:
            e = _find(a, m, p, c)
            if e >= 0:
                break
            add_edges += 1
            p = a[olk + p]
        if p >= 0:
            q = a[odst + e]
            if a[oln + p] + 1 != a[oln + q]:
                eq = a[ohd + q]
                while eq >= 0:
                    add_edges += 1
                    eq = a[onx + eq]
                # q on the walk (e.g. q == last after "c c") gets its edge on c before the clone
                # copies q's edges: the clone copies that edge too
                s = last
                while s != p:
                    if s == q:
                        add_edges += 1
                        break
                    s = a[olk + s]
        if (
            n_text + 1 > m[CT]
            or n_states + 2 > m[CS]
            or m[N_EDGES] + add_edges > m[CE]
            or 2 * (m[N_EDGES] + add_edges) > m[CH]
        ):
            m[NEED] = add_edges
            break
        i = n_text
        a[i] = c
        m[N_TEXT] = n_text + 1
        cur = n_states
        m[N_STATES] = n_states + 1
        a[oln + cur] = a[oln + last] + 1
        a[ofi + cur] = i
        a[ore + cur] = i
        a[ohd + cur] = -1
        a[olk + cur] = -1
        p = last
        while p >= 0:
            e = _find(a, m, p, c)
            if e >= 0:
                break
            _add_edge(a, m, p, c, cur)
            p = a[olk + p]
        if p < 0:
            a[olk + cur] = 0
        else:
            q = a[odst + e]
            if a[oln + p] + 1 == a[oln + q]:
                a[olk + cur] = q
            else:
                clone = m[N_STATES]
                m[N_STATES] = clone + 1
                a[oln + clone] = a[oln + p] + 1
                a[olk + clone] = a[olk + q]
                a[ofi + clone] = a[ofi + q]
                a[ore + clone] = a[ore + q]
                a[ohd + clone] = -1
                eq = a[ohd + q]
                while eq >= 0:
                    _add_edge(a, m, clone, a[m[O_TOK] + eq], a[odst + eq])
                    eq = a[onx + eq]
                while p >= 0:
                    e = _find(a, m, p, c)
                    if e < 0 or a[odst + e] != q:
                        break
                    a[odst + e] = clone
                    p = a[olk + p]
                a[olk + q] = clone
                a[olk + cur] = clone
        m[LAST] = cur
        # the longest suffix seen before is link[cur]: remember where its previous occurrence ended
        t = a[olk + cur]
        m[QPOS] = a[ore + t] if walk > 0 else a[ofi + t]
        s = t
        k = 0
        while s > 0 and k < walk:
            a[ore + s] = i
            s = a[olk + s]
            k += 1
        done += 1
    m[DONE] = done
    if done:
        m[GEN] += 1


@njit(cache=True)
def _continuation(a, n_text, pos, period, k, out):
    """Write up to ``k`` tokens following end position ``pos`` of text ``a[:n_text]`` into ``out``.

    Returns how many. Reading past the end of the text repeats the last ``period`` tokens (the match
    says the text is periodic with that period there); a negative token (separator) ends the draft.
    """
    n = 0
    while n < k:
        src = pos + 1 + n
        if src < n_text:
            tok = a[src]
        elif period > 0 and n >= period:
            tok = out[n - period]
        else:
            break
        if tok < 0:
            break
        out[n] = tok
        n += 1
    return n


@njit(cache=True)
def _advance(new, a, m, ctl):
    """Feed ``new`` to the running match ``ctl[C_GSTATE], ctl[C_GLEN]`` against automaton (a, m).

    Invariant: the matched string (length ``ctl[C_GLEN]``) is a suffix of every string of the state.
    Falling back keeps the length while the suffix link's strings are still longer (``min``), which
    keeps the match valid, and exact, even when the automaton grew (a state split by a clone) since
    the match last moved.
    """
    s = ctl[C_GSTATE]
    ln = ctl[C_GLEN]
    oln, olk = m[O_LEN], m[O_LINK]
    for j in range(new.shape[0]):
        c = new[j]
        while True:
            t = _goto(a, m, s, c) if c >= 0 else -1
            if t >= 0:
                s = t
                ln += 1
                break
            if s == 0:
                ln = 0
                break
            s = a[olk + s]
            ln = min(ln, a[oln + s])
    ctl[C_GSTATE] = s
    ctl[C_GLEN] = ln


@njit(cache=True)
def _step(new, a, m, out, ga, gm, ctl):
    """One decode step: append ``new`` to the own automaton (a, m), advance the group match, draft.

    Returns the draft length written to ``out`` (0 when no match of ``ctl[C_MIN]`` tokens), or -1 when
    the own arena must grow first (``m[DONE]`` tokens were appended; the caller grows it and calls
    again with the rest of ``new``). ``ctl[C_SOURCE]`` and ``ctl[C_MATCH]`` say which text the draft
    came from and the match length. When the group automaton grew since the last step (its
    generation changed), the group match is redone over the last :data:`RESYNC_TOKENS` tokens (a
    longer match may exist now) unless it is already longer.

    The group match is advanced over exactly the tokens appended by this call, also when it returns
    -1: the tokens appended before the arena filled up are not in the rest of ``new`` that the retry
    passes, and a match that skipped them could claim a string that is not a suffix of the text.
    """
    n_before = m[N_TEXT]
    _extend(new, a, m)
    use_group = ctl[C_GROUP] != 0
    if use_group:
        if gm[GEN] != ctl[C_GGEN]:
            ctl[C_GGEN] = gm[GEN]
            if ctl[C_GLEN] <= RESYNC_TOKENS:
                ctl[C_GSTATE] = 0
                ctl[C_GLEN] = 0
                _advance(a[max(0, n_before - RESYNC_TOKENS) : n_before], ga, gm, ctl)
        _advance(a[n_before : m[N_TEXT]], ga, gm, ctl)
    if m[DONE] < new.shape[0]:
        return -1
    n = m[N_TEXT]
    own_len = 0
    if n > 0:
        t = a[m[O_LINK] + m[LAST]]
        if t > 0:
            own_len = a[m[O_LEN] + t]
    grp_len = ctl[C_GLEN] if use_group else 0
    k = min(ctl[C_K], out.shape[0])
    ctl[C_SOURCE] = SOURCE_NONE
    ctl[C_MATCH] = max(own_len, grp_len)
    if ctl[C_MATCH] < max(ctl[C_MIN], 1) or k <= 0:
        return 0
    if own_len >= grp_len:
        ctl[C_SOURCE] = SOURCE_OWN
        pos = m[QPOS]
        return _continuation(a, n, pos, n - 1 - pos, k, out)
    ctl[C_SOURCE] = SOURCE_GROUP
    s = ctl[C_GSTATE]
    gpos = ga[gm[O_RECENT] + s] if gm[WALK] > 0 else ga[gm[O_FIRST] + s]
    return _continuation(ga, gm[N_TEXT], gpos, 0, k, out)


@njit(cache=True)
def _rehash(a, m):
    mask = m[CH] - 1
    oh, osrc, otok = m[O_HASH], m[O_SRC], m[O_TOK]
    for i in range(m[CH]):
        a[oh + i] = -1
    for e in range(m[N_EDGES]):
        i = _slot(a[osrc + e], a[otok + e], mask)
        while a[oh + i] >= 0:
            i = (i + 1) & mask
        a[oh + i] = e


@njit(cache=True, nogil=True)  # runs on the history builder thread, like _extend
def _compact(a, m, prefer, other):
    """The frozen layout of automaton (a, m) (see :meth:`SuffixAutomaton.freeze`): (arena, meta).
    ``prefer`` / ``other``: the end-position rows (O_RECENT, O_FIRST or the reverse). The returned
    meta has COMPACT = 1, or 2 when a state lacks its implicit edge (a broken automaton)."""
    nt, ns, ne = m[N_TEXT], m[N_STATES], m[N_EDGES]
    pos = np.empty(ns, np.int32)
    itok = np.full(ns, -1, np.int32)
    for s in range(ns):
        p = a[m[prefer] + s]
        tp = a[p + 1] if p >= 0 and p + 1 < nt else -1
        if tp < 0:
            q = a[m[other] + s]
            tq = a[q + 1] if q >= 0 and q + 1 < nt else -1
            if tq >= 0:
                p, tp = q, tq
        pos[s] = p
        if s > 0 and tp >= 0:  # the root keeps all its edges explicit (its end position is -1)
            itok[s] = tp
    t0 = np.full(ns, -1, np.int32)
    deg = np.zeros(ns, np.int32)  # explicit edges per state
    osrc, otok, odst = m[O_SRC], m[O_TOK], m[O_DST]
    for e in range(ne):
        sr, tk = a[osrc + e], a[otok + e]
        if tk < 0:
            continue  # an edge on a separator: no query follows it
        if tk == itok[sr]:
            t0[sr] = a[odst + e]
        else:
            deg[sr] += 1
    ok = True
    nx = 0
    nex = 0
    for s in range(ns):
        if itok[s] >= 0 and t0[s] < 0:
            ok = False
        if deg[s] > 0:
            nx += 1
            nex += deg[s]
    fm = m.copy()
    fm[COMPACT] = 1 if ok else 2
    fm[CT], fm[CS], fm[CE], fm[CH] = nt, ns, nex, 0
    fm[O_LEN] = nt
    fm[O_LINK] = nt + ns
    fm[O_POS] = nt + 2 * ns
    fm[O_RECENT] = fm[O_POS]
    fm[O_X] = nt + 3 * ns
    fm[O_XT0] = nt + 4 * ns
    fm[O_XOFF] = fm[O_XT0] + nx
    fm[O_ETOK] = fm[O_XOFF] + nx + 1
    fm[O_EDST] = fm[O_ETOK] + nex
    fm[O_HASH] = fm[O_EDST] + nex
    fa = np.empty(fm[O_HASH], np.int32)
    fa[:nt] = a[:nt]
    fa[fm[O_LEN] : fm[O_LEN] + ns] = a[m[O_LEN] : m[O_LEN] + ns]
    fa[fm[O_LINK] : fm[O_LINK] + ns] = a[m[O_LINK] : m[O_LINK] + ns]
    fa[fm[O_POS] : fm[O_POS] + ns] = pos
    cur = np.empty(ns, np.int32)  # where a state's next explicit edge goes
    j = 0
    off = 0
    for s in range(ns):
        if deg[s] > 0:
            fa[fm[O_X] + s] = -2 - j
            fa[fm[O_XT0] + j] = t0[s]
            fa[fm[O_XOFF] + j] = off
            cur[s] = off
            off += deg[s]
            j += 1
        else:
            fa[fm[O_X] + s] = t0[s] if t0[s] >= 0 else X_NONE
    fa[fm[O_XOFF] + nx] = nex
    et, ed = fm[O_ETOK], fm[O_EDST]
    for e in range(ne):
        sr, tk = a[osrc + e], a[otok + e]
        if tk >= 0 and tk != itok[sr]:
            fa[et + cur[sr]] = tk
            fa[ed + cur[sr]] = a[odst + e]
            cur[sr] += 1
    for j in range(nx):  # each state's explicit edges sorted by token, for the bisection in _goto
        lo, hi = fa[fm[O_XOFF] + j], fa[fm[O_XOFF] + j + 1]
        if hi - lo > 1:
            order = np.argsort(fa[et + lo : et + hi], kind="mergesort")
            toks = fa[et + lo : et + hi][order]
            dsts = fa[ed + lo : ed + hi][order]
            fa[et + lo : et + hi] = toks
            fa[ed + lo : ed + hi] = dsts
    return fa, fm


def _layout(m: np.ndarray, ct: int, cs: int, ce: int, ch: int) -> int:
    """Write capacities and offsets into ``m``; return the arena size (int32 slots)."""
    m[CT], m[CS], m[CE], m[CH] = ct, cs, ce, ch
    off = ct
    for row in _STATE_ROWS:
        m[row] = off
        off += cs
    for row in _EDGE_ROWS:
        m[row] = off
        off += ce
    m[O_HASH] = off
    return off + ch


class SuffixAutomaton:
    """A suffix automaton over int token ids, grown one token at a time.

    ``occurrence``: "recent" or "first" (see the module docstring). ``capacity``: initial token
    capacity (the arena doubles on demand). Memory: :attr:`nbytes` (allocated) and
    :meth:`bytes_per_token`; :meth:`free` releases it. Token ids must fit int32; negative ids are
    separators (never matched, never drafted).
    """

    def __init__(self, capacity: int = 256, occurrence: str = "recent"):
        if occurrence not in ("recent", "first"):
            raise ValueError(f"occurrence={occurrence!r}: use 'recent' or 'first'")
        self.occurrence = occurrence
        self._alloc(max(int(capacity), _MIN_CAP))

    # ---- storage -------------------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        self.meta = np.zeros(_META, np.int64)
        size = _layout(self.meta, cap, 2 * cap, 2 * cap, _pow2(4 * cap))
        self.arena = np.empty(size, np.int32)
        m, a = self.meta, self.arena
        a[m[O_HASH] :] = -1
        for row, value in zip(_STATE_ROWS, (0, -1, -1, -1, -1), strict=True):
            a[m[row]] = value
        m[N_STATES] = 1
        m[QPOS] = -1
        m[WALK] = RECENT_WALK if self.occurrence == "recent" else 0

    def _grow(self) -> None:
        """Enlarge the arena so the pending extension fits (its exact need was computed by _extend)."""
        old_a, old_m = self.arena, self.meta.copy()
        ct, cs, ce, ch = (int(old_m[i]) for i in (CT, CS, CE, CH))
        n_text, n_states, n_edges = int(old_m[N_TEXT]), int(old_m[N_STATES]), int(old_m[N_EDGES])
        need = n_edges + int(old_m[NEED])
        if n_text + 1 > ct:
            ct *= 2
        if n_states + 2 > cs:
            cs *= 2
        if need > ce:
            ce = max(2 * ce, need)
        rehash = 2 * need > ch
        if rehash:
            ch = _pow2(max(2 * ch, 2 * need))
        m = self.meta
        a = np.empty(_layout(m, ct, cs, ce, ch), np.int32)
        a[:n_text] = old_a[:n_text]
        for row in _STATE_ROWS:
            a[m[row] : m[row] + n_states] = old_a[old_m[row] : old_m[row] + n_states]
        for row in _EDGE_ROWS:
            a[m[row] : m[row] + n_edges] = old_a[old_m[row] : old_m[row] + n_edges]
        if rehash:
            _rehash(a, m)
        else:
            a[m[O_HASH] :] = old_a[old_m[O_HASH] :]
        self.arena = a

    def append(self, tokens) -> None:
        """Append token ids (any int sequence or array). Amortised O(1) per token."""
        if getattr(self, "frozen", False):
            raise RuntimeError("this SuffixAutomaton was frozen (read-only, no edge lists): it cannot grow")
        new = np.ascontiguousarray(tokens, dtype=np.int32)
        while new.shape[0]:
            _extend(new, self.arena, self.meta)
            new = new[int(self.meta[DONE]) :]
            if new.shape[0]:
                self._grow()

    def step(self, new: np.ndarray, out: np.ndarray, ctl: np.ndarray, group: SuffixAutomaton | None = None) -> int:
        """Append ``new`` (contiguous int32 array), then write a draft into ``out``; return its length.

        ``ctl`` (from :func:`new_ctl`) holds the draft size k, the minimum match length and the
        running match against ``group`` (used when ``ctl[C_GROUP]`` is set and ``group`` is given);
        the draft is at most ``min(k, len(out))`` tokens (a zero-length ``out`` only catches up).
        The draft continues the longer of the own match (longest repeated suffix of this text) and
        the group match (ties go to the own text). ``out`` needs room for k int32 tokens.
        """
        if new.shape[0] and getattr(self, "frozen", False):
            raise RuntimeError("this SuffixAutomaton was frozen (read-only): step() can only draft, not append")
        g = group if group is not None else _EMPTY
        while True:
            r = _step(new, self.arena, self.meta, out, g.arena, g.meta, ctl)
            if r >= 0:
                return r
            new = new[int(self.meta[DONE]) :]
            self._grow()

    def free(self) -> None:
        """Release the arena (the object is empty afterwards and can be reused)."""
        self.frozen = False
        self._alloc(_MIN_CAP)

    def freeze(self) -> None:
        """Make the automaton read-only in a compact layout (33-35 B per token on the benchmark data,
        against 90-91 B in use growing); :meth:`append` and :meth:`step` with tokens raise afterwards.

        Per state: length, suffix link, ONE end position (the preferred occurrence, ``occurrence``,
        when a real token follows it, else the other, as a draft would fall back) and ``X``. A state's
        transition on the token that follows its end position is *implicit*: that token is in the text,
        so only the target is stored (every state but the root and the ends of responses has one, and
        for most states it is the only edge). ``X`` is that target when it is the only edge, ``X_NONE``
        when the state has none, else ``-2 - j`` for row ``j`` of a side table (the implicit target or
        -1, and where the state's other edges start in two token-sorted rows, token and target,
        searched by bisection). Edges on separators are dropped (no query follows them). Matching
        (``_advance``, ``_goto``) and drafting (``_continuation`` from the end position) work as
        before, and state numbers are kept.

        Source: the implicit edge reads its token from the text at the state's end position, as a
        compact DAWG (Blumer et al. 1987) reads its edge labels from the text.
        """
        if getattr(self, "frozen", False):
            return
        prefer, other = (O_RECENT, O_FIRST) if self.meta[WALK] else (O_FIRST, O_RECENT)
        fa, fm = _compact(self.arena, self.meta, prefer, other)
        if fm[COMPACT] != 1:
            raise RuntimeError("suffix automaton invariant broken: a state lacks the edge its end position implies")
        self.arena, self.meta, self.frozen = fa, fm, True

    # ---- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.meta[N_TEXT])

    @property
    def text(self) -> np.ndarray:
        """The token ids appended so far (a view)."""
        return self.arena[: len(self)]

    @property
    def generation(self) -> int:
        """Number of append calls that added tokens (changes whenever the automaton grew)."""
        return int(self.meta[GEN])

    @property
    def num_states(self) -> int:
        return int(self.meta[N_STATES])

    @property
    def num_edges(self) -> int:
        return int(self.meta[N_EDGES])

    @property
    def nbytes(self) -> int:
        """Bytes allocated by this automaton (arena and meta)."""
        return self.arena.nbytes + self.meta.nbytes

    @property
    def used_bytes(self) -> int:
        """Bytes of the arena in use (text, states, edges, and the hash table at its current size)."""
        m = self.meta
        if m[COMPACT]:
            return self.nbytes  # frozen: exactly sized
        return 4 * (int(m[N_TEXT]) + 5 * int(m[N_STATES]) + 4 * int(m[N_EDGES]) + int(m[CH])) + self.meta.nbytes

    def bytes_per_token(self) -> float:
        """Allocated bytes / tokens appended (inf when empty)."""
        n = len(self)
        return self.nbytes / n if n else float("inf")

    def suffix_match(self) -> tuple[int, int]:
        """(length, end position) of the longest suffix of the text that also ends earlier.

        ``end position`` is the index of that earlier occurrence's last token (per ``occurrence``);
        (0, -1) when no suffix repeats.
        """
        if len(self) == 0:
            return 0, -1
        m = self.meta
        t = int(self.arena[m[O_LINK] + m[LAST]])
        if t <= 0:
            return 0, -1
        return int(self.arena[m[O_LEN] + t]), int(m[QPOS])

    def propose(self, k: int, min_match: int = 1) -> np.ndarray:
        """Up to ``k`` draft tokens continuing the longest repeated suffix (int32 array, maybe empty).

        Empty when the longest repeated suffix is shorter than ``min_match`` tokens.
        """
        out = np.empty(max(k, 0), np.int32)
        return out[: self.step(np.empty(0, np.int32), out, new_ctl(k, min_match))]

    def continuation(self, pos: int, k: int) -> np.ndarray:
        """Up to ``k`` tokens of the text after end position ``pos`` (stops at separators and the end)."""
        out = np.empty(max(k, 0), np.int32)
        return out[: _continuation(self.arena, len(self), pos, 0, k, out)]

    def advance(self, ctl: np.ndarray, tokens) -> None:
        """Feed another text's new ``tokens`` to the match in ``ctl``: afterwards it holds the longest
        suffix of that text that occurs in this automaton's text (amortised O(1) per token)."""
        _advance(np.ascontiguousarray(tokens, dtype=np.int32), self.arena, self.meta, ctl)

    def match_position(self, ctl: np.ndarray) -> int:
        """End position in this text of an occurrence of ``ctl``'s matched string (-1 if empty)."""
        s = int(ctl[C_GSTATE])
        if s <= 0 or ctl[C_GLEN] <= 0:
            return -1
        return int(self.arena[self.meta[O_RECENT if self.meta[WALK] else O_FIRST] + s])


def new_ctl(k: int, min_match: int = 1, group: bool = False) -> np.ndarray:
    """The per-text control array of :meth:`SuffixAutomaton.step`: draft size ``k`` (>= 0), minimum
    match length, whether to consult a group automaton; the group match starts empty."""
    if k < 0 or min_match < 1:
        raise ValueError(f"k={k} must be >= 0 and min_match={min_match} >= 1")
    ctl = np.zeros(_CTL, np.int64)
    ctl[C_K], ctl[C_MIN], ctl[C_GROUP] = k, min_match, int(group)
    return ctl


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()


_EMPTY = SuffixAutomaton(capacity=_MIN_CAP)
