import { beforeAll, describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import type { Message, Tool } from "../../lib/core/trajectory.ts";
import { BYTE_TO_CHAR } from "../../lib/model/tokenizer-bytes.ts";
import { buildTinyTokenizerFiles, trainBpe, TINY_SPECIAL_TOKENS } from "../../lib/model/tokenizer-tiny.ts";
import { loadTokenizer, type Tokenizer } from "../../lib/model/tokenizer.ts";
import { parseToolCalls } from "../../lib/model/tool-calls.ts";
import { writeTokenizerDir } from "./fixtures.ts";

let tiny: Tokenizer;
beforeAll(async () => {
  tiny = await loadTokenizer(writeTokenizerDir(buildTinyTokenizerFiles()));
});

function randomText(random: () => number, length: number): string {
  const ranges: [number, number][] = [
    [0x20, 0x7e], [0x09, 0x0d], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x4e00, 0x9fff], [0x3040, 0x30ff],
    [0x1f300, 0x1faff], [0x0, 0x1f], [0x10000, 0x10ffff], [0xe000, 0xf8ff],
  ];
  let text = "";
  while (text.length < length) {
    const [lo, hi] = ranges[Math.floor(random() * ranges.length)];
    const codePoint = lo + Math.floor(random() * (hi - lo + 1));
    text += String.fromCodePoint(codePoint);
  }
  return text;
}

describe("trainBpe", () => {
  it("merges the most frequent pair first and breaks ties by the pair's text", () => {
    const initial = { a: 0, b: 1, c: 2 };
    // "ab" occurs 3 times, "bc" 3 times (tie: "a\0b" < "b\0c"), then "abc" from ("ab","c") 2 times.
    const { vocab, merges } = trainBpe(new Map([["abc", 2], ["ab", 1], ["bc", 1]]), initial, 5);
    expect(merges).toEqual([["a", "b"], ["ab", "c"]]);
    expect(vocab).toEqual({ a: 0, b: 1, c: 2, ab: 3, abc: 4 });
  });

  it("says how large a vocabulary the corpus supports when asked for too much", () => {
    expect(() => trainBpe(new Map([["ab", 2]]), { a: 0, b: 1 }, 4)).toThrow(/supports a vocabulary of 3 tokens.*not 4; ask for a smaller vocabSize/);
  });
});

describe("the tiny tokenizer files", () => {
  it("are deterministic", () => {
    expect(buildTinyTokenizerFiles()).toEqual(buildTinyTokenizerFiles());
  });

  it("hold all 256 byte tokens, learned merges and Qwen-style special tokens", () => {
    const json = JSON.parse(buildTinyTokenizerFiles()["tokenizer.json"]) as {
      model: { vocab: Record<string, number>; merges: [string, string][] };
      added_tokens: { id: number; content: string; special: boolean }[];
    };
    BYTE_TO_CHAR.forEach((char, byte) => expect(json.model.vocab[char]).toBe(byte));
    for (const [left, right] of json.model.merges) {
      expect(json.model.vocab[left]).toBeDefined();
      expect(json.model.vocab[right]).toBeDefined();
      expect(json.model.vocab[left + right]).toBeDefined();
    }
    expect(json.added_tokens.map((t) => [t.id, t.content, t.special])).toEqual(TINY_SPECIAL_TOKENS.map((t, i) => [507 + i, t.content, t.special]));
    expect(tiny.vocabSize).toBe(512);
    expect(Object.keys(buildTinyTokenizerFiles({ vocabSize: 300 }))).toEqual(["tokenizer.json", "tokenizer_config.json", "generation_config.json"]);
  });

  it("rejects a vocabulary too small for the bytes and special tokens", () => {
    expect(() => buildTinyTokenizerFiles({ vocabSize: 200 })).toThrow("buildTinyTokenizerFiles: vocabSize must be an integer >= 261 (256 bytes + 5 special tokens), got 200");
  });

  it("loads with eos ids from generation_config.json and tokenizer_config.json, and pad", () => {
    const imEnd = tiny.tokenToId("<|im_end|>")!;
    const endOfText = tiny.tokenToId("<|endoftext|>")!;
    expect(tiny.eosTokenIds).toEqual([imEnd, endOfText]);
    expect(tiny.padTokenId).toBe(endOfText);
    expect(tiny.isSpecial(imEnd)).toBe(true);
    expect(tiny.isSpecial(tiny.tokenToId("<tool_call>")!)).toBe(false);
  });
});

describe("the tiny tokenizer encodes and decodes", () => {
  it("round-trips arbitrary UTF-8 text (NFC-normalized, as Qwen's normalizer does)", () => {
    const random = seededRandom(7);
    for (let i = 0; i < 200; i++) {
      const text = randomText(random, 1 + Math.floor(random() * 40));
      const ids = tiny.encode(text);
      expect(tiny.decode(ids)).toBe(text.normalize("NFC"));
      const bytes = ids.flatMap((id) => Array.from(tiny.tokenBytes(id)));
      expect(Uint8Array.from(bytes)).toEqual(new TextEncoder().encode(text.normalize("NFC")));
    }
  });

  it("compresses the text it was trained on and keeps special tokens whole", () => {
    const text = '<|im_start|>assistant\n<tool_call>\n{"name": "make_move", "arguments": {"cell": "B2"}}\n</tool_call><|im_end|>';
    const ids = tiny.encode(text);
    expect(ids.length).toBeLessThan(new TextEncoder().encode(text).length / 2);
    expect(ids[0]).toBe(tiny.tokenToId("<|im_start|>"));
    expect(ids.at(-1)).toBe(tiny.tokenToId("<|im_end|>"));
    expect(tiny.decode(ids)).toBe(text);
    expect(tiny.decode(ids, { skipSpecialTokens: true })).toBe('assistant\n<tool_call>\n{"name": "make_move", "arguments": {"cell": "B2"}}\n</tool_call>');
  });

  it("learns its merges from a corpus of its own when given one: that corpus's words become single tokens", async () => {
    const corpus = Array.from({ length: 40 }, (_, i) => `{"messageId":"<1.${i}@northwind-energy.com>","subject":"Bluewater budget review"}`).join("\n");
    const own = await loadTokenizer(writeTokenizerDir(buildTinyTokenizerFiles({ vocabSize: 319, corpus })));
    const text = '{"messageId":"<1.7@northwind-energy.com>","subject":"Bluewater budget review"}';
    const ids = own.encode(text, { addSpecialTokens: false });
    expect(ids.length).toBeLessThan(tiny.encode(text, { addSpecialTokens: false }).length / 2);
    expect(ids.map((id) => own.decode([id]))).toContain(" budget");
    expect(own.decode(ids)).toBe(text);
    expect(() => buildTinyTokenizerFiles({ vocabSize: 320, corpus })).toThrow(/supports a vocabulary of 314 tokens/);
  });

  it("streams multi-byte characters split over byte tokens without ever emitting half a character", () => {
    const text = "héllo 世界 🤗🧑‍🚀 ok";
    const ids = tiny.encode(text);
    expect(ids.length).toBeGreaterThan(12); // the CJK and emoji bytes are separate tokens here
    const stream = tiny.createStreamDecoder();
    const pieces = ids.map((id) => stream.push(id));
    pieces.push(stream.flush());
    expect(pieces.join("")).toBe(text);
    for (const piece of pieces) expect(piece).not.toContain("\uFFFD");
    const emojiStart = pieces.findIndex((p) => p.includes("🤗"));
    expect(pieces.slice(emojiStart - 3, emojiStart)).toEqual(["", "", ""]); // 4 bytes, complete on the 4th token
  });

  it("streams exactly what decode returns, for random id sequences that include broken UTF-8 and added tokens", () => {
    const random = seededRandom(11);
    for (let i = 0; i < 200; i++) {
      const ids = Array.from({ length: 1 + Math.floor(random() * 30) }, () => Math.floor(random() * tiny.vocabSize));
      for (const skipSpecialTokens of [false, true]) {
        const stream = tiny.createStreamDecoder({ skipSpecialTokens });
        const streamed = ids.map((id) => stream.push(id)).join("") + stream.flush();
        expect(streamed).toBe(tiny.decode(ids, { skipSpecialTokens }));
      }
    }
  });

  it("streams special tokens or skips them, and flushes an unfinished character as U+FFFD", () => {
    const imEnd = tiny.tokenToId("<|im_end|>")!;
    const ids = [...tiny.encode("世"), imEnd];
    const keep = tiny.createStreamDecoder();
    expect(ids.map((id) => keep.push(id)).join("") + keep.flush()).toBe("世<|im_end|>");
    const skip = tiny.createStreamDecoder({ skipSpecialTokens: true });
    expect(ids.map((id) => skip.push(id)).join("") + skip.flush()).toBe("世");

    const cut = tiny.createStreamDecoder();
    const firstTwoBytes = tiny.encode("世").slice(0, 2);
    expect(firstTwoBytes.map((id) => cut.push(id)).join("")).toBe("");
    expect(cut.flush()).toBe("\uFFFD");
    expect(tiny.decode(firstTwoBytes)).toBe("\uFFFD");
  });
});

describe("the tiny chat template", () => {
  const tools: Tool[] = [
    { type: "function", function: { name: "make_move", description: "Place your mark.", parameters: { type: "object", properties: { cell: { type: "string" } }, required: ["cell"] } } },
  ];
  const prompt: Message[] = [
    { role: "system", content: "You play tic-tac-toe as O." },
    { role: "user", content: "  1 2 3\nA X . .\nB . . .\nC . . ." },
  ];
  const toolTurn: Message = {
    role: "assistant",
    content: null,
    tool_calls: [{ id: "call_1", type: "function", function: { name: "make_move", arguments: '{"cell":"B2"}' } }],
  };

  it("renders system, tools, user, assistant tool calls and tool results in ChatML", () => {
    const text = tiny.applyChatTemplate(
      [...prompt, toolTurn, { role: "tool", tool_call_id: "call_1", content: '{"ok": true}' }, { role: "assistant", content: "Done." }],
      { tools },
    );
    expect(text).toBe(
      "<|im_start|>system\nYou play tic-tac-toe as O.\n\n# Tools\n\nThese functions are available. Their JSON signatures are inside <tools></tools>:\n<tools>\n" +
        '{"type": "function", "function": {"name": "make_move", "description": "Place your mark.", "parameters": {"type": "object", "properties": {"cell": {"type": "string"}}, "required": ["cell"]}}}\n' +
        '</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n  1 2 3\nA X . .\nB . . .\nC . . .<|im_end|>\n" +
        '<|im_start|>assistant\n<tool_call>\n{"name": "make_move", "arguments": {"cell": "B2"}}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\n<tool_response>\n{"ok": true}\n</tool_response><|im_end|>\n' +
        "<|im_start|>assistant\nDone.<|im_end|>\n",
    );
  });

  it("renders an assistant turn as the generation prompt followed by what the model generates", () => {
    const withPrompt = tiny.applyChatTemplate(prompt, { tools, addGenerationPrompt: true });
    const withTurn = tiny.applyChatTemplate([...prompt, toolTurn], { tools });
    expect(withTurn.startsWith(withPrompt)).toBe(true);
    const generated = withTurn.slice(withPrompt.length);
    expect(generated.endsWith("<|im_end|>\n")).toBe(true);
    const parsed = parseToolCalls(generated.slice(0, -"<|im_end|>\n".length));
    expect(parsed.errors).toEqual([]);
    expect(parsed.toolCalls.map((c) => [c.function.name, c.function.arguments])).toEqual([["make_move", '{"cell":"B2"}']]);
  });

  it("turns the template's raise_exception into an ArtError naming the template", () => {
    expect(() => tiny.applyChatTemplate([{ role: "developer", content: "x" }])).toThrow(
      /rendering the chat template from .*tokenizer_config\.json \(chat_template\) failed: this template knows the roles system, user, assistant and tool, not developer/,
    );
  });
});
