import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import type { Message, Tool } from "../../lib/core/trajectory.ts";
import { buildTinyTokenizerFiles } from "../../lib/model/tokenizer-tiny.ts";
import { PrefixEncodingCache, prefixReuseObstacle, type PrefixReuseJson } from "../../lib/model/tokenizer-prefix-cache.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { QWEN3_TOKENIZER_DIR } from "../../scripts/serve-small-tokenizer.ts";
import { tinyFilesWith, writeTokenizerDir } from "./fixtures.ts";

type JsonObject = Record<string, unknown>;

/** The library's own encoding of the whole text (what a reused prefix must reproduce), and the tokenizer's added tokens. */
function library(dir: string): { whole: (text: string) => number[]; added: { id: number; content: string }[] } {
  const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")) as JsonObject;
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) as JsonObject;
  const hf = new HfTokenizer({ added_tokens: [], decoder: null, normalizer: null, pre_tokenizer: null, post_processor: null, ...json }, config);
  return { whole: (text) => hf.encode(text, { add_special_tokens: false }).ids, added: json.added_tokens as { id: number; content: string }[] };
}

/** Text that stresses the cut: byte-level merges, NFC pairs, whitespace runs, and added tokens' texts, whole and in part. */
function awkwardText(random: () => number, pieces: number): string {
  const parts = ["hello", " world", "  ", "\n\n", "\t", "e\u0301", "\u0301", "é", "日本語", "🙂", "👩‍👩‍👧", "{\"a\": 1}", "2048", "'s", "<|im_", "im_end|>",
    "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<|endoftext|>", "  \n", ".", "...", "x"];
  let text = "";
  for (let i = 0; i < pieces; i++) text += parts[Math.floor(random() * parts.length)];
  return text;
}

const TOOLS: Tool[] = [{ type: "function", function: { name: "search", description: "Search the inbox", parameters: { type: "object", properties: { q: { type: "string" } } } } }];

/** Requests of several concurrent conversations, each turn rendering the whole history again, as rollouts do. */
function conversationTexts(render: (messages: Message[], tools: boolean) => string, random: () => number): string[] {
  const texts: string[] = [];
  const conversations = Array.from({ length: 6 }, (_, i) => ({
    tools: i % 2 === 0,
    messages: [{ role: "system", content: `You play a game. ${awkwardText(random, 4)}` }, { role: "user", content: i < 3 ? "Start." : awkwardText(random, 6) }] as Message[],
  }));
  for (let turn = 0; turn < 5; turn++) {
    for (const c of conversations) {
      texts.push(render(c.messages, c.tools));
      c.messages.push({ role: "assistant", content: awkwardText(random, 5) });
      c.messages.push({ role: "user", content: awkwardText(random, 8) });
    }
  }
  return texts;
}

describe("prefixReuseObstacle", () => {
  const tiny = JSON.parse(buildTinyTokenizerFiles()["tokenizer.json"]) as PrefixReuseJson & { added_tokens: NonNullable<PrefixReuseJson["added_tokens"]> };

  it("finds nothing in the Qwen-style tokenizers the project serves", () => {
    expect(prefixReuseObstacle(tiny)).toBeNull();
    expect(prefixReuseObstacle(JSON.parse(readFileSync(join(QWEN3_TOKENIZER_DIR, "tokenizer.json"), "utf8")))).toBeNull();
  });

  it("names what makes a cut after an added token unlike the tokenizer's own", () => {
    const withToken = (change: Partial<(typeof tiny.added_tokens)[number]>) => ({ ...tiny, added_tokens: [...tiny.added_tokens, { id: 9999, content: "<x>", special: true, ...change }] });
    expect(prefixReuseObstacle(withToken({ rstrip: true }))).toMatch(/"<x>" strips the whitespace/);
    expect(prefixReuseObstacle(withToken({ lstrip: true }))).toMatch(/strips the whitespace/);
    expect(prefixReuseObstacle(withToken({ special: false }))).toMatch(/"<x>" is matched in normalized text/);
    expect(prefixReuseObstacle(withToken({ content: "<|im_end|>x" }))).toMatch(/"<\|im_end\|>" lies inside "<\|im_end\|>x"/);
    expect(prefixReuseObstacle({ ...tiny, pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first" } })).toMatch(/prepend_scheme "first"/);
  });
});

describe("encode with reused prefixes", () => {
  for (const [name, dir] of [["Qwen3's tokenizer", QWEN3_TOKENIZER_DIR], ["the tiny tokenizer", writeTokenizerDir(buildTinyTokenizerFiles())]] as const) {
    it(`gives ${name}'s own ids for multi-turn requests, unrelated texts and texts cut anywhere`, async () => {
      const tokenizer = await loadTokenizer(dir);
      const { whole } = library(dir);
      const random = seededRandom(7);
      const texts = conversationTexts((messages, tools) => tokenizer.applyChatTemplate(messages, { tools: tools ? TOOLS : undefined, addGenerationPrompt: true }), random);
      // Shorter texts cut at every kind of place (inside a token's text, right after one), repeats, and strangers.
      for (const text of texts.slice(-8)) {
        for (let k = 0; k < 4; k++) texts.push(text.slice(0, Math.floor(random() * text.length)));
        texts.push(text);
      }
      for (let k = 0; k < 20; k++) texts.push(awkwardText(random, 30));
      for (const text of texts) expect(tokenizer.encode(text, { addSpecialTokens: false }), JSON.stringify(text.slice(-80))).toEqual(whole(text));
    });
  }

  it("encodes only the new turn of a conversation, and what it reuses is exact", () => {
    const dir = writeTokenizerDir(buildTinyTokenizerFiles());
    const { whole, added } = library(dir);
    const cache = new PrefixEncodingCache(whole, added);
    const first = "<|im_start|>system\nYou play.<|im_end|>\n<|im_start|>user\nStart.<|im_end|>\n<|im_start|>assistant\n";
    const second = `${first}I move left.<|im_end|>\n<|im_start|>user\nBoard: 2 4<|im_end|>\n<|im_start|>assistant\n`;
    expect(cache.encode(first)).toEqual(whole(first));
    const before = { ...cache.stats };
    expect(cache.encode(second)).toEqual(whole(second));
    // Reused: the first request up to its last added token ("<|im_start|>" before "assistant\n").
    const reused = whole(first.slice(0, first.lastIndexOf("<|im_start|>") + "<|im_start|>".length)).length;
    expect(cache.stats.reusedIds - before.reusedIds).toBe(reused);
    expect(cache.stats.encodedIds - before.encodedIds).toBe(whole(second).length - reused);
  });

  it("keeps at most maxEntries texts, the least recently used leaving first", () => {
    const dir = writeTokenizerDir(buildTinyTokenizerFiles());
    const { whole, added } = library(dir);
    const cache = new PrefixEncodingCache(whole, added, { maxEntries: 2 });
    const texts = ["a<|im_end|>b", "c<|im_end|>d", "e<|im_end|>f"];
    for (const text of texts) cache.encode(text);
    const reusedBefore = cache.stats.reusedIds;
    cache.encode(`${texts[0]}x`); // evicted: encoded whole
    expect(cache.stats.reusedIds).toBe(reusedBefore);
    cache.encode(`${texts[2]}x`); // kept: "e<|im_end|>" reused
    expect(cache.stats.reusedIds).toBe(reusedBefore + whole("e<|im_end|>").length);
  });

  it("would be wrong for a token that strips the whitespace after it, which is why such tokenizers encode whole", async () => {
    const files = tinyFilesWith({ tokenizer: (json) => {
      for (const token of json.added_tokens as JsonObject[]) if (token.content === "<|im_end|>") token.rstrip = true;
    } });
    const dir = writeTokenizerDir(files);
    const { whole, added } = library(dir);
    const unsafe = new PrefixEncodingCache(whole, added);
    const text = "hi<|im_end|>   there";
    unsafe.encode("hi<|im_end|>");
    expect(unsafe.encode(text)).not.toEqual(whole(text));
    const tokenizer = await loadTokenizer(dir);
    tokenizer.encode("hi<|im_end|>", { addSpecialTokens: false });
    expect(tokenizer.encode(text, { addSpecialTokens: false })).toEqual(whole(text));
  });
});
