"""RNN, GRU and LSTM, unrolled over their fixed number of time steps into the generic kinds.

Each step is ONNX's equations as written (``linear`` for X_t W^T + b and H W_r^T, ``slice`` for
the gates, ``sigmoid`` / ``tanh`` / ``relu``, ``binary`` products), forward, reverse or both;
``Y`` stacks every step's hidden state with ``concat``, ``Y_h`` the last. The time axis is X's
first (layout 0) or second (layout 1), never the importer's batch axis. Supported: the default
activations (or their names given explicitly), no ``clip``, every sequence at full length, zero
or absent initial states; LSTM's peepholes and GRU's ``linear_before_reset`` too. ``L`` is the
``lower.Lowering`` being written (not imported here: lower.py imports this module for its table).
"""
from __future__ import annotations

import numpy as np

from .values import Act, Unsupported

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULTS = {"RNN": ("tanh",), "GRU": ("sigmoid", "tanh"), "LSTM": ("sigmoid", "tanh", "tanh")}
KINDS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}


def _checked(L, op: str, x: Act, seq_axis: int):
    """The per-direction activations; Unsupported for what this unrolling does not cover."""
    names = L.attr("activations")
    dirs = 2 if _direction(L) == "bidirectional" else 1
    acts = tuple(a.decode().lower() if isinstance(a, bytes) else a.lower() for a in names) if names else DEFAULTS[op] * dirs
    problems = []
    if any(a not in KINDS for a in acts) or L.attr("activation_alpha") or L.attr("activation_beta"):
        problems.append(f"activations {acts} (only Sigmoid, Tanh, Relu without alpha or beta)")
    if L.attr("clip") is not None:
        problems.append("clip")
    lens = L.const(4, "sequence_lens")
    if lens is not None and np.any(np.asarray(lens) != x.shape[seq_axis]):
        problems.append("sequences shorter than the input (sequence_lens)")
    for i, what in ((5, "initial_h"), (6, "initial_c")):
        v = L.const(i, what) if i < len(L.node.input) else None
        if v is not None and np.any(np.asarray(v) != 0):
            problems.append(f"a non-zero {what}")
    if op == "LSTM" and len(L.node.output) > 2 and L.node.output[2] in L.read:
        problems.append("its Y_c output is used")
    if problems:
        raise Unsupported("; ".join(problems))
    per = len(DEFAULTS[op])
    return [acts[d * per:(d + 1) * per] for d in range(dirs)]


def _direction(L) -> str:
    d = L.attr("direction", b"forward")
    return d.decode() if isinstance(d, bytes) else d


class Step:
    """Emits one direction's ops: the shapes of a step's state, the gates, the elementwise ops."""

    def __init__(self, L, lead: tuple[int, ...], hidden: int):
        self.L, self.lead, self.hidden = L, lead, hidden

    def shape(self, width=None):
        return self.lead + ((self.hidden if width is None else width),)

    def linear(self, src: str, w: np.ndarray, bias: np.ndarray, hint: str) -> str:
        L = self.L
        return L.emit("linear", [src], self.shape(w.shape[0]), [L.param(w.T, hint + ".w"), L.param(bias, hint + ".b")],
                      name=L._fresh(hint))

    def gate(self, src: str, k: int) -> str:
        index = tuple((0, n, 1) for n in self.lead) + ((k * self.hidden, (k + 1) * self.hidden, 1),)
        return self.L.emit("slice", [src], self.shape(), index=index, name=self.L._fresh(src + f".g{k}"))

    def op(self, fn: str, a: str, b: str | None = None) -> str:
        """An activation of a, or a (fn) b elementwise; of a's shape."""
        L, shape = self.L, self.L.shapes[a]
        if b is None:
            return L.emit(KINDS[fn], [a], shape, name=L._fresh(a + f".{fn}"))
        if fn == "add":
            return L.emit("add", [a, b], shape, name=L._fresh(a + ".add"))
        return L.emit("binary", [a, b], shape, fn=fn, name=L._fresh(a + f".{fn}"))

    def vector(self, fn: str, a: str, v: np.ndarray) -> str:
        """a (fn) v, v a constant vector along the hidden axis."""
        L = self.L
        return L.emit("binary", [a], self.shape(), [L.param(v, a + ".v")], fn=fn, swap=False, width=self.hidden,
                      name=L._fresh(a + f".{fn}v"))

    def peephole(self, g: str, p: np.ndarray, c: str) -> str:
        """g + p ⊙ c, p a constant vector."""
        return self.op("add", g, self.vector("mul", c, p))


def _weights(L, op: str, d: int, hidden: int):
    """W, R, Wb, Rb of direction d, float64."""
    w, r = (np.asarray(L.const(i, what), dtype=np.float64)[d] for i, what in ((1, "W"), (2, "R")))
    b = L.const(3, "B") if len(L.node.input) > 3 else None
    b = np.zeros(2 * GATES[op] * hidden) if b is None else np.asarray(b, dtype=np.float64)[d]
    return w, r, b[:GATES[op] * hidden], b[GATES[op] * hidden:]


def _cell(s: Step, op: str, acts, x_t: str, h, c, w, r, wb, rb, peep, lbr: bool):
    """One time step: (h, c) after it; h and c None while they are zero (no initial state)."""
    hid = s.hidden
    if op == "RNN":
        g = s.linear(x_t, w, wb + rb, x_t + ".x")
        g = g if h is None else s.op("add", g, s.linear(h, r, np.zeros(hid), x_t + ".h"))
        return s.op(acts[0], g), None
    if op == "LSTM":
        g = s.linear(x_t, w, wb + rb, x_t + ".x")
        g = g if h is None else s.op("add", g, s.linear(h, r, np.zeros(4 * hid), x_t + ".h"))
        i, o, f, cc = (s.gate(g, k) for k in range(4))
        if c is not None and peep is not None:
            i, f = s.peephole(i, peep[:hid], c), s.peephole(f, peep[2 * hid:], c)
        i, f, cc = s.op(acts[0], i), s.op(acts[0], f), s.op(acts[1], cc)
        c_new = s.op("mul", i, cc) if c is None else s.op("add", s.op("mul", f, c), s.op("mul", i, cc))
        o = s.op(acts[0], o if peep is None else s.peephole(o, peep[hid:2 * hid], c_new))
        return s.op("mul", o, s.op(acts[2], c_new)), c_new
    # GRU: gates z, r, h
    gx = s.linear(x_t, w, wb + np.concatenate([rb[:2 * hid], np.zeros(hid)]), x_t + ".x")
    zr = [s.gate(gx, k) for k in range(2)]
    if h is not None:
        gh = s.linear(h, r[:2 * hid], np.zeros(2 * hid), x_t + ".h")
        zr = [s.op("add", zr[k], s.gate(gh, k)) for k in range(2)]
    z, rt = (s.op(acts[0], v) for v in zr)
    cand, rbh = s.gate(gx, 2), rb[2 * hid:]
    if h is None:                                          # H = 0: the recurrent term is its bias
        cand = s.op("add", cand, s.vector("mul", rt, rbh)) if lbr else s.vector("add", cand, rbh)
    elif lbr:
        cand = s.op("add", cand, s.op("mul", rt, s.linear(h, r[2 * hid:], rbh, x_t + ".hh")))
    else:
        cand = s.op("add", cand, s.linear(s.op("mul", rt, h), r[2 * hid:], rbh, x_t + ".hh"))
    cand = s.op(acts[1], cand)
    if h is None:                                          # (1 - z) h~
        return s.op("sub", cand, s.op("mul", z, cand)), None
    return s.op("add", cand, s.op("mul", z, s.op("sub", h, cand))), None   # h~ + z (h - h~)


def lower_recurrent(L):
    """RNN, GRU, LSTM unrolled (see the module's docstring)."""
    op, x = L.node.op_type, L.values[L.node.input[0]]
    if not isinstance(x, Act) or len(x.shape) != 3:
        raise Unsupported("its input is not a 3-D activation")
    layout = int(L.attr("layout", 0))
    seq_axis = 1 if layout else 0
    acts = _checked(L, op, x, seq_axis)
    a = x.axis(seq_axis)
    hidden = int(L.attr("hidden_size"))
    lead = tuple(n for i, n in enumerate(x.per_sample[:-1]) if i != a)
    s = Step(L, lead, hidden)
    steps = x.shape[seq_axis]
    xs = []
    for t in range(steps):
        index = tuple(t if i == a else (0, n, 1) for i, n in enumerate(x.per_sample))
        xs.append(L.emit("slice", [x.name], lead + (x.per_sample[-1],), index=index, name=L._fresh(f"{x.name}.t{t}")))
    peep = L.const(7, "P") if len(L.node.input) > 7 else None
    finals, every = [], []
    for d, order in enumerate([range(steps)] if _direction(L) == "forward" else [range(steps - 1, -1, -1)]
                              if _direction(L) == "reverse" else [range(steps), range(steps - 1, -1, -1)]):
        w, r, wb, rb = _weights(L, op, d, hidden)
        p = None if peep is None else np.asarray(peep, dtype=np.float64)[d]
        h = c = None
        hs = {}
        for t in order:
            h, c = _cell(s, op, acts[d], xs[t], h, c, w, r, wb, rb, p, bool(L.attr("linear_before_reset", 0)))
            hs[t] = h
        finals.append(h)
        every.append([hs[t] for t in range(steps)])
    _outputs(L, s, layout, finals, every)


def _outputs(L, s: Step, layout: int, finals: list[str], every: list[list[str]]) -> None:
    """Y (every step, every direction) and Y_h (the last), where the graph reads them."""
    at = 0 if layout == 0 else len(s.lead)
    shape = s.shape()
    if len(L.node.output) > 1 and L.node.output[1]:
        unit = shape[:at] + (1,) + shape[at:]
        parts = [L.emit("reshape", [h], unit, shape=unit, name=L._fresh(h + ".dir")) for h in finals]
        L.result(_joined(L, parts, unit, at), 1)
    if L.node.output[0]:
        unit = shape[:at] + (1, 1) + shape[at:]
        dirs = []
        for hs in every:
            parts = [L.emit("reshape", [h], unit, shape=unit, name=L._fresh(h + ".step")) for h in hs]
            dirs.append(_joined(L, parts, unit, at))
        L.result(_joined(L, dirs, L.shapes[dirs[0]], at + 1), 0)


def _joined(L, parts: list[str], unit, axis: int) -> str:
    if len(parts) == 1:
        return parts[0]
    shape = unit[:axis] + (unit[axis] * len(parts),) + unit[axis + 1:]
    return L.emit("concat", parts, shape, axis=axis, order="t" * len(parts), name=L._fresh(parts[0] + ".cat"))


RECURRENT = {"RNN": lower_recurrent, "GRU": lower_recurrent, "LSTM": lower_recurrent}
