// The vec4 accessors of the gpu arm's WGSL, generated from one template per kind of access.
//
// Core WGSL cannot pass a storage buffer to a function, so a helper that loads four floats of
// `work` and one that loads four floats of `gs` must be two functions with the same body. Writing
// those bodies by hand once per buffer would make the WGSL files repeat themselves; here each kind
// of access is written once, and each kernel set declares which buffers get which (its
// `accessors`). kda/gpu/device.ts appends the result to the set's layout header (layout.ts).

/** A storage binding (or workgroup array) the kernels address in vec4 runs, by its WGSL name. */
type Buffer = string;

/** A dimension that bounds a run of four: channels (K) or value columns (V). */
type Limit = "K" | "V";

/** One kind of vec4 access, and the WGSL function it becomes for a buffer. */
interface Template {
  /** The function's name for a buffer and, where it has one, a bound. */
  name(buffer: Buffer, limit: Limit): string;
  /** The function's WGSL text. */
  body(buffer: Buffer, limit: Limit, name: string): string;
}

const LANES = ["x", "y", "z", "w"] as const;

/** The four offsets 0..3 added to a first index, as WGSL text. */
const plus = (i: number) => (i === 0 ? "" : ` + ${i}u`);

/**
 * A tile store: `<buffer><rowSuffix>` stores one row (skipped when row >= cv) lane by lane, each
 * lane under its guard; `name` stores the four rows of a mat4x4f tile. `extra` is the last
 * parameter of both (the region width, or whether the diagonal is zeroed too).
 */
function tileStore(
  b: Buffer,
  name: string,
  rowSuffix: string,
  extra: string,
  rowOffset: string,
  lane: (i: number, lane: string) => [guard: string, value: string],
): string {
  return [
    `fn ${b}${rowSuffix}(region: u32, row: u32, c: u32, value: vec4f, cv: u32, ${extra}: u32) {`,
    "  if (row >= cv) {",
    "    return;",
    "  }",
    `  let at = region + ${rowOffset} + c;`,
    ...LANES.map((l, i) => {
      const [guard, value] = lane(i, l);
      return `  if (${guard}) { ${b}[at${plus(i)}] = ${value}; }`;
    }),
    "}",
    `fn ${name}(region: u32, r: u32, c: u32, t: mat4x4f, cv: u32, ${extra}: u32) {`,
    ...LANES.map((_, i) => `  ${b}${rowSuffix}(region, r${plus(i)}, c, t[${i}], cv, ${extra});`),
    "}",
  ].join("\n");
}

/** A tile lane inside the region's width. */
const keepInWidth = (i: number, lane: string): [string, string] => [
  `c${plus(i)} < width`,
  `value.${lane}`,
];

/** A tile lane of a lower triangle: zero above the diagonal (and on it, when strict = 1). */
const keepLower = (i: number, lane: string): [string, string] => [
  `c${plus(i)} < cv`,
  `select(0.0, value.${lane}, c${plus(i)} + strict <= row)`,
];

/** The kinds of accessor a set may ask for. */
export type AccessorKind =
  | "load"
  | "loadVec"
  | "loadVecIf"
  | "element"
  | "store"
  | "storeVec"
  | "storeTransposed"
  | "storeTileTransposed"
  | "gather"
  | "gatherVec"
  | "storeRows"
  | "storeTriangle";

const TEMPLATES: Record<AccessorKind, Template> = {
  /** Four consecutive entries `row + j..`, zero past the bound. */
  load: {
    name: (b, l) => (l === "K" ? `${b}K4` : `${b}Cols`),
    body: (b, l, name) =>
      [
        `fn ${name}(row: u32, j: u32) -> vec4f {`,
        "  var value = vec4f(0.0);",
        ...LANES.map((c, i) =>
          `  if (j${plus(i)} < p.${l}) { value.${c} = ${b}[row + j${plus(i)}]; }`
        ),
        "  return value;",
        "}",
      ].join("\n"),
  },
  /**
   * As `load`, for a vec4 binding (a read-only view of a buffer the package sizes in whole vec4s):
   * an aligned run in one load, any other lane by lane.
   */
  loadVec: {
    name: (b, l) => (l === "K" ? `${b}K4` : `${b}Cols`),
    body: (b, l, name) =>
      [
        `fn ${name}(row: u32, j: u32) -> vec4f {`,
        "  let i = row + j;",
        `  if ((i & 3u) == 0u && j + 3u < p.${l}) {`,
        `    return ${b}[i >> 2u];`,
        "  }",
        "  var value = vec4f(0.0);",
        ...LANES.map((c, n) => `  if (j${plus(n)} < p.${l}) { value.${c} = ${b}F(i${plus(n)}); }`),
        "  return value;",
        "}",
      ].join("\n"),
  },
  /** As `loadVec` (of the same binding), where `live`; zero, with no load, where not. */
  loadVecIf: {
    name: (b, l) => (l === "K" ? `${b}K4If` : `${b}ColsIf`),
    body: (b, l, name) =>
      [
        `fn ${name}(row: u32, j: u32, live: bool) -> vec4f {`,
        "  if (!live) {",
        "    return vec4f(0.0);",
        "  }",
        `  return ${l === "K" ? `${b}K4` : `${b}Cols`}(row, j);`,
        "}",
      ].join("\n"),
  },
  /** One float of a vec4 binding, by its index as a float array. */
  element: {
    name: (b) => `${b}F`,
    body: (b, _l, name) => `fn ${name}(i: u32) -> f32 {\n  return ${b}[i >> 2u][i & 3u];\n}`,
  },
  /**
   * Stores four consecutive entries `row + j..`, skipping those past the bound: one test of the
   * bound and four plain stores when the run lies inside it (on the H200 faster than four guarded
   * stores, docs/kda.md 3.2), lane by lane otherwise.
   */
  store: {
    name: (b, l) => (l === "K" ? `${b}StoreK` : `${b}StoreCols`),
    body: (b, l, name) =>
      [
        `fn ${name}(row: u32, j: u32, value: vec4f) {`,
        `  if (j + 3u < p.${l}) {`,
        ...LANES.map((c, i) => `    ${b}[row + j${plus(i)}] = value.${c};`),
        "    return;",
        "  }",
        ...LANES.map((c, i) =>
          `  if (j${plus(i)} < p.${l}) { ${b}[row + j${plus(i)}] = value.${c}; }`
        ),
        "}",
      ].join("\n"),
  },
  /**
   * As `store`, for a writable vec4 view of a buffer the package makes: an aligned run in one
   * store, any other lane by lane (each its own float of the view).
   */
  storeVec: {
    name: (b, l) => (l === "K" ? `${b}StoreK` : `${b}StoreCols`),
    body: (b, l, name) =>
      [
        `fn ${name}(row: u32, j: u32, value: vec4f) {`,
        "  let i = row + j;",
        `  if ((i & 3u) == 0u && j + 3u < p.${l}) {`,
        `    ${b}[i >> 2u] = value;`,
        "    return;",
        "  }",
        ...LANES.map((c, n) =>
          `  if (j${plus(n)} < p.${l}) { ${b}[(i${plus(n)}) >> 2u][(i${
            plus(n)
          }) & 3u] = value.${c}; }`
        ),
        "}",
      ].join("\n"),
  },
  /** Stores row d of a [K, V] state tile transposed, as [V, K]: lanes run along V. */
  storeTransposed: {
    name: (b) => `${b}StoreT`,
    body: (b, _l, name) =>
      [
        `fn ${name}(base: u32, d: u32, j: u32, value: vec4f) {`,
        ...LANES.map((c, i) =>
          `  if (j${plus(i)} < p.V) { ${b}[base + (j${plus(i)}) * p.K + d] = value.${c}; }`
        ),
        "}",
      ].join("\n"),
  },
  /**
   * Stores a 4 x 4 tile of a [K, V] state (rows d.., columns j..) into a [V, K] region, four
   * channels a store (through the buffer's `<buffer>StoreK`, which the set declares beside it).
   */
  storeTileTransposed: {
    name: (b) => `${b}StoreTileT`,
    body: (b, _l, name) =>
      [
        `fn ${name}(region: u32, d: u32, j: u32, st: mat4x4f) {`,
        "  let tt = transpose(st);",
        ...LANES.map((_, i) =>
          `  if (j${plus(i)} < p.V) { ${b}StoreK(region + (j${plus(i)}) * p.K, d, tt[${i}]); }`
        ),
        "}",
      ].join("\n"),
  },
  /** Four entries `row + i.x .. row + i.w` (indices already clamped). */
  gather: {
    name: (b) => `${b}At4`,
    body: (b, _l, name) =>
      `fn ${name}(row: u32, i: vec4u) -> vec4f {\n` +
      `  return vec4f(${LANES.map((c) => `${b}[row + i.${c}]`).join(", ")});\n}`,
  },
  /** As `gather`, for a vec4 binding. */
  gatherVec: {
    name: (b) => `${b}At4`,
    body: (b, _l, name) =>
      `fn ${name}(row: u32, i: vec4u) -> vec4f {\n` +
      `  return vec4f(${LANES.map((c) => `${b}F(row + i.${c})`).join(", ")});\n}`,
  },
  /**
   * Stores a register tile (rows r.., columns c..) into a [C, width] region, skipping rows >= cv
   * and columns >= width (and, as `<buffer>StoreRow`, one row of it).
   */
  storeRows: {
    name: (b) => `${b}StoreRows`,
    body: (b, _l, name) => tileStore(b, name, "StoreRow", "width", "row * width", keepInWidth),
  },
  /**
   * Stores a register tile (rows r.., columns c..) of a lower-triangular [C, C] region: columns
   * c.. < cv, the entries above the diagonal (on it too, when strict = 1) written as zeros (and,
   * as `<buffer>StoreTriRow`, one row of it).
   */
  storeTriangle: {
    name: (b) => `${b}StoreTri`,
    body: (b, _l, name) => tileStore(b, name, "StoreTriRow", "strict", "row * p.C", keepLower),
  },
};

/** One accessor a set asks for: [kind, buffer (its WGSL name), bound]. */
export type AccessorDecl = readonly [AccessorKind, Buffer, Limit];

/**
 * The WGSL accessors a set declares, one function per row: bounded vec4 loads and stores
 * (`workK4`, `xCols`, `outpStoreCols`, ...), transposed state stores (`statesStoreT`), four-index
 * gathers (`gsAt4`) and register-tile stores (`gsStoreRows`, `workStoreTri`).
 *
 * @param accessors The set's accessor table.
 * @returns WGSL source, to follow the layout header.
 * @example
 * ```ts
 * wgslAccessors([["storeTriangle", "gs", "K"]]).includes("fn gsStoreTri("); // true
 * ```
 */
export function wgslAccessors(accessors: readonly AccessorDecl[]): string {
  const parts = ["// ---- generated by kda/gpu/accessors.ts: do not edit ----"];
  for (const [kind, buffer, limit] of accessors) {
    const template: Template = TEMPLATES[kind];
    parts.push(template.body(buffer, limit, template.name(buffer, limit)));
  }
  parts.push("// ---- end of generated accessors ----", "");
  return parts.join("\n");
}
