// A small SVG line chart for examples/recall.ts: panels side by side, each with its own curves,
// axes, ticks and legend. No dependencies.

/** One curve: its label, colour, dash pattern and points. */
export interface Curve {
  /** Legend text. */
  label: string;
  /** Stroke colour. */
  color: string;
  /** SVG stroke-dasharray, e.g. "4 3" (solid when absent). */
  dash?: string;
  /** [step, value] points. */
  points: [number, number][];
}

/** One panel of the chart. */
export interface Panel {
  /** Title above the panel. */
  title: string;
  /** The x axis label. */
  xLabel: string;
  /** The y axis label. */
  yLabel: string;
  /** The curves. */
  curves: Curve[];
  /** Lines of grey text below the legend (e.g. why a curve is missing). */
  notes?: string[];
  /** Start the y axis at 0 (default true); false fits it to the curves. */
  yFromZero?: boolean;
}

const esc = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

function ticks(lo: number, hi: number, n = 5): number[] {
  const span = hi - lo || 1;
  const step0 = span / n, mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) ?? 10 * mag;
  const out: number[] = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9 * span; t += step) {
    out.push(Number(t.toPrecision(12)));
  }
  return out;
}

function panelSvg(p: Panel, x0: number, width: number, height: number, rows: number): string {
  // the legend and the notes sit below the plot, one row each, so they never hide a curve
  const m = { l: 66, r: 12, t: 28, b: 44 + 15 * rows };
  const w = width - m.l - m.r, h = height - m.t - m.b;
  const pts = p.curves.flatMap((c) => c.points);
  const xs = pts.map((q) => q[0]), ys = pts.map((q) => q[1]).filter(Number.isFinite);
  const xLo = Math.min(0, ...xs), xHi = Math.max(1, ...xs);
  const fromZero = p.yFromZero ?? true;
  const yMin = Math.min(...ys), yMax = Math.max(...ys), pad = 0.08 * (yMax - yMin || 1e-3);
  const yLo = fromZero ? Math.min(0, yMin) : yMin - pad;
  const yHi = fromZero ? Math.max(1e-9, yMax) * 1.05 : yMax + pad;
  const X = (v: number) => x0 + m.l + ((v - xLo) / (xHi - xLo)) * w;
  const Y = (v: number) => m.t + h - ((v - yLo) / (yHi - yLo)) * h;
  const out: string[] = [];
  out.push(
    `<text x="${x0 + m.l + w / 2}" y="18" text-anchor="middle" font-weight="bold">${
      esc(p.title)
    }</text>`,
  );
  out.push(
    `<rect x="${x0 + m.l}" y="${m.t}" width="${w}" height="${h}" fill="none" stroke="#888"/>`,
  );
  for (const t of ticks(xLo, xHi)) {
    out.push(
      `<line x1="${X(t)}" y1="${m.t + h}" x2="${X(t)}" y2="${m.t + h + 4}" stroke="#888"/>`,
      `<text x="${X(t)}" y="${m.t + h + 16}" text-anchor="middle">${t}</text>`,
    );
  }
  for (const t of ticks(yLo, yHi)) {
    out.push(
      `<line x1="${x0 + m.l}" y1="${Y(t)}" x2="${x0 + m.l + w}" y2="${Y(t)}" stroke="#eee"/>`,
      `<text x="${x0 + m.l - 6}" y="${Y(t) + 4}" text-anchor="end">${t}</text>`,
    );
  }
  out.push(
    `<text x="${x0 + m.l + w / 2}" y="${m.t + h + 32}" text-anchor="middle">${
      esc(p.xLabel)
    }</text>`,
    `<text transform="translate(${x0 + 14} ${m.t + h / 2}) rotate(-90)" text-anchor="middle">${
      esc(p.yLabel)
    }</text>`,
  );
  p.curves.forEach((c, i) => {
    const d = c.points.filter((q) => Number.isFinite(q[1]))
      .map((q, j) => `${j ? "L" : "M"}${X(q[0]).toFixed(1)},${Y(q[1]).toFixed(1)}`).join("");
    if (d) {
      out.push(
        `<path d="${d}" fill="none" stroke="${c.color}" stroke-width="1.6"${
          c.dash ? ` stroke-dasharray="${c.dash}"` : ""
        }/>`,
      );
    }
    const ly = m.t + h + 50 + 15 * i, lx = x0 + m.l;
    out.push(
      `<line x1="${lx}" y1="${ly - 4}" x2="${lx + 22}" y2="${ly - 4}" stroke="${c.color}" ` +
        `stroke-width="2"${c.dash ? ` stroke-dasharray="${c.dash}"` : ""}/>`,
      `<text x="${lx + 28}" y="${ly}">${esc(c.label)}</text>`,
    );
  });
  (p.notes ?? []).forEach((n, i) => {
    const ny = m.t + h + 50 + 15 * (p.curves.length + i);
    const text = n.length > 72 ? `${n.slice(0, 71)}…` : n;
    out.push(`<text x="${x0 + m.l}" y="${ny}" fill="#666">${esc(text)}</text>`);
  });
  return out.join("\n");
}

/** The chart: panels side by side, each `width` pixels wide and 300 tall plus its legend rows. */
export function chartSvg(panels: Panel[], width = 480): string {
  const rows = Math.max(...panels.map((p) => p.curves.length + (p.notes?.length ?? 0)));
  const height = 300 + 15 * rows;
  const total = width * panels.length;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${total}" height="${height}" ` +
    `viewBox="0 0 ${total} ${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="${total}" height="${height}" fill="white"/>`,
    ...panels.map((p, i) => panelSvg(p, i * width, width, height, rows)),
    "</svg>",
    "",
  ].join("\n");
}
