"""Inline SVG charts built from plain strings: no plotting library, no script.

Every function takes the (untrusted) dict from results.json and returns Markup, or None when
the data is unusable, so a malformed chart drops out instead of breaking the page. Any text
that came from results.json goes through escape(). SVGs use no ids, so any number of them can
share a page.
"""
import math

from markupsafe import Markup, escape

FONT = 'font-family="system-ui, sans-serif" font-size="11"'
# Errors within the tolerance bound get pale blues, errors over it yellow to dark red: the eye
# should land on the tiles that fail, not on harmless rounding noise. Exact zeros get a grey.
COOL_STOPS = [(247, 251, 255), (198, 219, 239), (107, 174, 214)]
WARM_STOPS = [(254, 224, 144), (252, 141, 89), (215, 48, 31), (127, 0, 0)]
ZERO_FILL = "#eef0f3"
NONFINITE_FILL = "#5b2a86"


def fmt(x) -> str:
    """Short number for labels: 3 significant digits, scientific when tiny or huge."""
    if x is None:
        return "—"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.3g}"
    return f"{x:.2e}".replace("e-0", "e-").replace("e+0", "e")


def fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} TiB"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ramp(stops, t: float) -> str:
    """Colour for t in [0, 1] along `stops`."""
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    a, b = stops[i], stops[i + 1]
    return "#%02x%02x%02x" % tuple(round(a[k] + (b[k] - a[k]) * f) for k in range(3))


def _svg(width, height, body, label) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
                  f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}" '
                  f'{FONT}>{"".join(body)}</svg>')


def _text(x, y, s, anchor="start", extra="") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(s)}</text>'


def _thin(size, spacing=14) -> int:
    """Label every k-th tick so labels `size` px apart are at least `spacing` px apart."""
    return max(1, math.ceil(spacing / size)) if size else 1


class _ErrorScale:
    """Log scale from lo to hi; cool colours up to `bound`, warm ones above it."""

    def __init__(self, values, bound):
        positive = [abs(v) for v in values if v != 0]
        self.bound = bound
        self.lo = self.hi = None
        if positive:
            ends = positive + ([bound] if bound else [])
            self.lo, self.hi = min(ends), max(ends)
            if self.hi / self.lo < 10:  # at least a decade, so near-equal cells don't look far apart
                self.lo = self.hi / 10

    def position(self, v):
        """Where |v| sits on the scale, 0 (lo) to 1 (hi)."""
        return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))

    def colour(self, v):
        v = min(max(abs(v), self.lo), self.hi)
        if self.bound is None:
            return _ramp(WARM_STOPS, self.position(v))
        b = self.position(self.bound)
        p = self.position(v)
        if p <= b:
            return _ramp(COOL_STOPS, p / b if b else 1.0)
        return _ramp(WARM_STOPS, (p - b) / (1 - b))


def heatmap_svg(heatmap: dict, bound=None):
    """Max abs error per cell, with a colour legend: as grading/diagnoses/flash.py heatmap() draws
    it, a row per tile of the tensor's own rows (query tiles for o, L and dq, key tiles for dk
    and dv) and a column per batch x head; the labels say so when results.json gives them.

    `bound` (the verdict's max_bound for this tensor) splits the colour scale, and cells over it
    get a dark outline, so failing tiles stand out even when printed in grey.
    """
    values = heatmap.get("values")
    if not isinstance(values, list) or not values or not all(isinstance(r, list) and r for r in values):
        return None
    rows, cols = len(values), max(len(r) for r in values)
    row_starts = heatmap.get("row_starts") or list(range(rows))
    col_starts = heatmap.get("col_starts") or list(range(cols))
    cells = [v for r in values for v in r if v is not None]
    bound = float(bound) if _finite(bound) and bound > 0 else None
    scale = _ErrorScale([v for v in cells if _finite(v)], bound)
    tensor = str(heatmap.get("tensor") or "")
    what = f"{tensor} error" if tensor else "error"
    row_label = str(heatmap.get("row_label") or ("key tile" if tensor in ("dk", "dv") else "query tile"))
    col_label = str(heatmap.get("col_label") or "batch x head")
    subtitle = f"rows: {row_label} · columns: {col_label}"
    cw = 56 if cols == 1 else min(max(360 / cols, 4), 40)
    ch = min(max(300 / rows, 4), 26)
    left, top = 62, 40
    grid_w, grid_h = cw * cols, ch * rows
    legend_x = left + max(grid_w, 100) + 28
    body = [_text(left, 14, f"max |error| of {tensor} per tile" if tensor else "max |error| per tile",
                  extra='font-weight="600"'),
            _text(left, 28, subtitle, extra='fill="#555"')]
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            if v is None:
                continue
            if not _finite(v):
                fill, over = NONFINITE_FILL, True
            elif v == 0:
                fill, over = ZERO_FILL, False
            else:
                fill, over = scale.colour(v), bound is not None and abs(v) > bound
            r0 = row_starts[i] if i < len(row_starts) else i
            c0 = col_starts[j] if j < len(col_starts) else j
            if min(cw, ch) < 8:  # outlines would swamp cells this small; the colour says enough
                stroke = ""
            else:
                stroke = ' stroke="#111" stroke-width="1.5"' if over else ' stroke="#fff" stroke-width="0.5"'
            tip = f"{row_label} {r0}, {col_label} {c0}: {fmt(v)}"
            if over and bound is not None:
                tip += f" (over the bound {fmt(bound)})"
            body.append(f'<rect x="{left + j * cw:.1f}" y="{top + i * ch:.1f}" width="{cw:.1f}" '
                        f'height="{ch:.1f}" fill="{fill}"{stroke}><title>{escape(tip)}</title></rect>')
    for i in range(0, rows, _thin(ch, 13)):
        label = row_starts[i] if i < len(row_starts) else i
        body.append(_text(left - 5, top + i * ch + ch / 2 + 4, str(label), "end"))
    if cols > 1:
        for j in range(0, cols, _thin(cw, 30)):
            label = col_starts[j] if j < len(col_starts) else j
            body.append(_text(left + j * cw + cw / 2, top + grid_h + 14, str(label), "middle"))
    x_title = col_label
    body.append(_text(left + grid_w / 2, top + grid_h + 30, x_title, "middle", 'fill="#555"'))
    body.append(_text(14, top + grid_h / 2, row_label, "middle",
                      f'fill="#555" transform="rotate(-90 14 {top + grid_h / 2:.1f})"'))
    body += _heat_legend(scale, legend_x, top, max(grid_h, 130),
                         any(not _finite(v) for v in cells))
    width = max(legend_x + 120, left + 6.2 * len(subtitle))
    height = top + max(grid_h, 130) + 62
    return _svg(width, height, body, f"heatmap of {what} per tile")


def _heat_legend(scale, x, top, height, has_nonfinite) -> list:
    # A stack of small rects rather than a gradient, which would need a page-unique id.
    body, n = [], 48
    if scale.lo is None:
        body.append(_text(x, top + 8, "no non-zero error"))
    else:
        for k in range(n):
            value = scale.lo * (scale.hi / scale.lo) ** (1 - (k + 0.5) / n)
            body.append(f'<rect x="{x}" y="{top + k * height / n:.1f}" width="14" '
                        f'height="{height / n + 0.6:.1f}" fill="{scale.colour(value)}"/>')
        body.append(f'<rect x="{x}" y="{top}" width="14" height="{height}" fill="none" stroke="#bbb"/>')
        bound_y = top + (1 - scale.position(scale.bound)) * height if scale.bound is not None else None
        # An end label that would collide with the bound's is dropped: the bound label says it.
        if bound_y is None or bound_y - top > 14:
            body.append(_text(x + 19, top + 8, fmt(scale.hi)))
        if bound_y is None or top + height - bound_y > 14:
            body.append(_text(x + 19, top + height, fmt(scale.lo)))
        if bound_y is not None:
            body.append(f'<line x1="{x - 4}" x2="{x + 18}" y1="{bound_y:.1f}" y2="{bound_y:.1f}" '
                        f'stroke="#111" stroke-width="2"/>')
            label_y = min(max(bound_y + 4, top + 8), top + height)
            body.append(_text(x + 19, label_y, f"bound {fmt(scale.bound)}", extra='font-weight="600"'))
    y = top + height + 18
    body.append(f'<rect x="{x}" y="{y - 9}" width="14" height="10" fill="{ZERO_FILL}" stroke="#bbb"/>')
    body.append(_text(x + 19, y, "exactly 0"))
    if has_nonfinite:
        body.append(f'<rect x="{x}" y="{y + 6}" width="14" height="10" fill="{NONFINITE_FILL}"/>')
        body.append(_text(x + 19, y + 15, "NaN / inf"))
    return body


def _bars(title, bars, limit, limit_label, over, unit_fmt, aria) -> Markup:
    """Horizontal bars [(label, value)], the first one the student's (red if `over`), and an
    optional dashed limit line."""
    top_value = max([v for _, v in bars] + ([limit] if limit else [])) * 1.15 or 1.0
    left, top, plot_w, bar_h, gap = 78, 26, 300, 20, 10

    def x(v):
        return left + plot_w * v / top_value

    body = [_text(left, 14, title, extra='font-weight="600"')]
    for i, (label, v) in enumerate(bars):
        y = top + i * (bar_h + gap)
        colour = ("#d7301f" if over else "#2e9d5b") if i == 0 else "#8a9bb0"
        body.append(_text(left - 6, y + bar_h / 2 + 4, label, "end"))
        body.append(f'<rect x="{left}" y="{y}" width="{max(x(v) - left, 1):.1f}" height="{bar_h}" '
                    f'fill="{colour}"><title>{escape(f"{label}: {unit_fmt(v)}")}</title></rect>')
        body.append(_text(x(v) + 4, y + bar_h / 2 + 4, unit_fmt(v)))
    axis_y = top + len(bars) * (bar_h + gap) - gap / 2
    body.append(f'<line x1="{left}" x2="{left}" y1="{top - 4}" y2="{axis_y}" stroke="#999"/>')
    if limit:
        body.append(f'<line x1="{x(limit):.1f}" x2="{x(limit):.1f}" y1="{top - 6}" y2="{axis_y + 4}" '
                    f'stroke="#111" stroke-dasharray="4 3" stroke-width="1.5"/>')
        body.append(_text(x(limit), axis_y + 18, limit_label, "middle"))
    return _svg(left + plot_w + 90, axis_y + 28, body, aria)


def timing_svg(timing: dict):
    """Student, reference and SDPA time (ms), with the budget (ratio x reference) as a line."""
    bars = [(label, timing.get(key)) for label, key in
            (("your code", "student_ms"), ("reference", "reference_ms"), ("SDPA", "sdpa_ms"))]
    bars = [(label, float(v)) for label, v in bars if _finite(v) and v >= 0]
    if not bars:
        return None
    reference, budget, ratio = timing.get("reference_ms"), timing.get("budget"), timing.get("ratio")
    limit = float(reference) * float(budget) if _finite(reference) and _finite(budget) else None
    over = _finite(ratio) and _finite(budget) and ratio > budget
    title = "time per call" + (f" · {fmt(ratio)}× the reference" if _finite(ratio) else "")
    return _bars(title, bars, limit, f"budget {fmt(budget)}× ref = {fmt(limit)} ms", over,
                 lambda v: f"{fmt(v)} ms", "timing chart")


def _log_ticks(lo, hi, base, max_ticks=6):
    a, b = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    exps = list(range(a, b + 1))
    step = max(1, math.ceil(len(exps) / max_ticks))
    return [base ** e for e in exps[::step]]


def memory_svg(memory: dict):
    """Peak memory against sequence length, log-log: yours, the reference's and the limit."""
    ns = memory.get("n")
    if not isinstance(ns, list) or not ns or not all(_finite(n) and n > 0 for n in ns):
        return None
    series = [("your code", "peak_bytes", "#d7301f", ""), ("reference", "reference_peak_bytes", "#5b7aa5", ""),
              ("limit", "limit_bytes", "#111", ' stroke-dasharray="5 4"')]
    lines = []
    for label, key, colour, dash in series:
        ys = memory.get(key)
        if isinstance(ys, list):
            points = [(n, y) for n, y in zip(ns, ys) if _finite(y) and y > 0]
            if points:
                lines.append((label, colour, dash, points))
    if not lines:
        return None
    if len(ns) == 1:  # one length measured: a line chart would be a single dot
        values = {label: pts[0][1] for label, _, _, pts in lines}
        bars = [(label, v) for label, v in values.items() if label != "limit"]
        limit = values.get("limit")
        over = limit is not None and values.get("your code", 0) > limit
        return _bars(f"peak memory at N = {int(ns[0])}", bars or [("limit", limit)], limit,
                     f"limit {fmt_bytes(limit)}" if limit else "", over, fmt_bytes, "memory chart")
    all_y = [y for *_, pts in lines for _, y in pts]
    x_lo, x_hi = min(ns), max(ns)
    y_ticks = _log_ticks(min(all_y), max(all_y), 2)
    y_lo, y_hi = min(y_ticks + all_y), max(y_ticks + all_y)
    if y_hi == y_lo:
        y_hi = y_lo * 2
    left, top, plot_w, plot_h = 70, 34, 320, 170

    def px(n):
        return left + (plot_w / 2 if x_hi == x_lo else plot_w * math.log(n / x_lo) / math.log(x_hi / x_lo))

    def py(y):
        return top + plot_h - plot_h * math.log(y / y_lo) / math.log(y_hi / y_lo)

    body = [_text(left, 14, "peak memory vs sequence length (log-log)", extra='font-weight="600"')]
    for t in y_ticks:
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e4e7eb"/>')
        body.append(_text(left - 5, py(t) + 4, fmt_bytes(t), "end"))
    for n in ns:
        body.append(f'<line x1="{px(n):.1f}" x2="{px(n):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#f0f2f4"/>')
        body.append(_text(px(n), top + plot_h + 14, str(int(n)), "middle"))
    body.append(_text(left + plot_w / 2, top + plot_h + 30, "sequence length N", "middle", 'fill="#555"'))
    body.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    for k, (label, colour, dash, points) in enumerate(lines):
        path = " ".join(f"{px(n):.1f},{py(y):.1f}" for n, y in points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for n, y in points:
            body.append(f'<circle cx="{px(n):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}">'
                        f'<title>{escape(f"{label}, N={int(n)}: {fmt_bytes(y)}")}</title></circle>')
        lx = left + plot_w + 12
        ly = top + 10 + k * 18
        body.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
                    f'stroke-width="2"{dash}/>')
        body.append(_text(lx + 22, ly, label))
    return _svg(left + plot_w + 100, top + plot_h + 40, body, "memory chart")


def histogram_svg(bins: list):
    """Class score histogram from classstats.histogram(): [(low_pct, high_pct, names)]."""
    if not bins:
        return None
    most = max(len(names) for *_, names in bins) or 1
    left, top, plot_h, bar_w, gap = 34, 36, 150, 38, 6
    body = [_text(left, 14, "submissions per score band (% of max)", extra='font-weight="600"')]
    for t in range(0, most + 1, max(1, math.ceil(most / 5))):
        y = top + plot_h - plot_h * t / most
        body.append(f'<line x1="{left}" x2="{left + len(bins) * (bar_w + gap)}" y1="{y:.1f}" y2="{y:.1f}" '
                    f'stroke="#e4e7eb"/>')
        body.append(_text(left - 5, y + 4, str(t), "end"))
    for i, (low, high, names) in enumerate(bins):
        x = left + gap / 2 + i * (bar_w + gap)
        h = plot_h * len(names) / most
        colour = heat_colour_fraction((low + high) / 200)
        tip = f"{low}–{high}%: {len(names)}" + (f" ({', '.join(names)})" if names else "")
        body.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w}" height="{max(h, 0):.1f}" '
                    f'fill="{colour}" stroke="#888" stroke-width="0.5"><title>{escape(tip)}</title></rect>')
        if names:
            body.append(_text(x + bar_w / 2, top + plot_h - h - 4, str(len(names)), "middle"))
    for i, (low, high, _) in enumerate(bins):  # labels on the band edges: 0, 10, ..., 100
        body.append(_text(left + i * (bar_w + gap), top + plot_h + 14, str(low), "middle"))
    body.append(_text(left + len(bins) * (bar_w + gap), top + plot_h + 14, str(bins[-1][1]), "middle"))
    body.append(f'<line x1="{left}" x2="{left + len(bins) * (bar_w + gap)}" y1="{top + plot_h}" '
                f'y2="{top + plot_h}" stroke="#999"/>')
    return _svg(left + len(bins) * (bar_w + gap) + 10, top + plot_h + 24, body, "score histogram")


def heat_colour_fraction(fraction, strong=False) -> str:
    """Red → amber → green for a score fraction in [0, 1]; grey when there is nothing to score.

    Pale by default so black text on it stays readable; `strong` for bars with no text on them.
    """
    if fraction is None:
        return "#9ca3af" if strong else "#e5e7eb"
    hue = 4 + 126 * min(max(fraction, 0.0), 1.0)
    return f"hsl({hue:.0f}, 62%, 46%)" if strong else f"hsl({hue:.0f}, 68%, 80%)"
