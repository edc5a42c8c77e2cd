// TRANSITION: moved to tests/_fixtures.ts.
export { agreement, bitsEqual, Worst } from "./_fixtures.ts";
