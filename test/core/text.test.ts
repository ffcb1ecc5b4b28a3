import { describe, expect, it } from "vitest";
import { clipText } from "../../lib/core/text.ts";

/** encodeURIComponent throws on half a surrogate pair, as nbconvert's UTF-8 writer does. */
function isWellFormed(text: string): boolean {
  try {
    encodeURIComponent(text);
    return true;
  } catch {
    return false;
  }
}

describe("clipText", () => {
  const astral = "ab😀cd"; // 😀 is two UTF-16 units, at 2 and 3

  it("keeps text that fits and cuts the rest, saying how much it hid", () => {
    expect(clipText(astral, 6)).toBe(astral);
    expect(clipText("abcdef", 3)).toBe("abc…");
    expect(clipText("abcdef", 3, (hidden) => ` (+${hidden})`)).toBe("abc (+3)");
  });

  it("never splits a surrogate pair", () => {
    expect(clipText(astral, 3)).toBe("ab…"); // the plain slice ends in the pair's first half
    expect(clipText(astral, 3, (hidden) => `+${hidden}`)).toBe("ab+4");
    expect(clipText(astral, 4)).toBe("ab😀…");
    for (let limit = 1; limit < astral.length; limit++) expect(isWellFormed(clipText(astral, limit)), `limit ${limit}`).toBe(true);
  });
});
