// An SVG heat map of a candidate's error, one panel per result tensor: rows are (sequence, head)
// pairs, columns are chunks (for states: rows sequences, columns heads). The colour of a cell is
// log10 of max|a−b| there over the tensor's max|b|, so an error confined to one chunk, to chunk
// boundaries or to the first chunk stands out as its own pattern.

import type { CandidateReport } from "./candidate.ts";

function colour(level: number): string {
  // level in [0, 1]: white (no error) through yellow to dark red (relative error 1).
  const t = Math.min(1, Math.max(0, level));
  const r = 255 - Math.round(80 * Math.max(0, t - 0.5) * 2);
  const g = Math.round(255 * (1 - t));
  const b = Math.round(255 * Math.max(0, 1 - 2 * t));
  return `rgb(${r},${g},${b})`;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

/**
 * Draws the heat maps of a candidate report.
 *
 * @param report The report of `checkCandidate`.
 * @returns SVG text.
 */
export function heatmapSvg(report: CandidateReport): string {
  const cell = 14, gap = 40, left = 60, floorExp = -9;
  let y = 30;
  const parts: string[] = [];
  let width = 400;
  for (const row of report.rows) {
    const { rows, cols, values, rowLabel, colLabel } = row.cells;
    const ref = row.agreement.refMax || 1;
    parts.push(
      `<text x="${left}" y="${y - 8}" font-size="12">${esc(row.name)}: max|a−b|/max|b| = ${
        row.agreement.rel.toExponential(2)
      } (bar ${row.bar.toExponential(1)}) ${
        !row.checked ? "unchecked" : row.ok ? "ok" : "FAIL"
      }; rows: ${esc(rowLabel)}, columns: ${esc(colLabel)}</text>`,
    );
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) {
        const rel = values[r * cols + c] / ref;
        // A NaN cell is as bad as it gets: drawn at the top of the scale.
        const level = Number.isNaN(rel)
          ? 1
          : rel > 0
          ? (Math.log10(rel) - floorExp) / -floorExp
          : 0;
        parts.push(
          `<rect x="${left + c * cell}" y="${y + r * cell}" width="${cell - 1}" height="${
            cell - 1
          }" ` +
            `fill="${colour(level)}"><title>${esc(row.name)} [${r}, ${c}]: ${
              rel.toExponential(2)
            }</title></rect>`,
        );
      }
    }
    width = Math.max(width, left + cols * cell + 20);
    y += rows * cell + gap;
  }
  const legend = Array.from(
    { length: 10 },
    (_, i) =>
      `<rect x="${left + i * 30}" y="${y}" width="30" height="10" fill="${colour(i / 9)}"/>` +
      `<text x="${left + i * 30}" y="${y + 24}" font-size="9">1e${floorExp + i}</text>`,
  ).join("");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${Math.max(width, left + 320)}" height="${
    y + 40
  }" font-family="sans-serif"><text x="10" y="16" font-size="13">candidate error per cell, ` +
    `relative to each tensor's max|reference| (${esc(report.precisionNote)})</text>${
      parts.join("")
    }` +
    `${legend}</svg>\n`;
}
