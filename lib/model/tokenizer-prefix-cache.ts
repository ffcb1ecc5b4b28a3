/**
 * Reuses the encodings of recent texts for a text that starts the same way. A multi-turn chat request renders the
 * whole conversation again each turn, and the server tokenizes it (1–4 µs a token in the JavaScript tokenizer) on the
 * thread that also runs the engine's passes, so that time is taken out of the rollouts (bench/chat-tokenize.ts). The
 * new text shares everything up to its last turn with the previous request's, so only the tail needs tokenizing.
 *
 * Why this gives exactly the tokenizer's own ids: Hugging Face tokenizers first cut a text at its added tokens
 * (`<|im_start|>`, `<|im_end|>`, ...; leftmost, longest) and then normalize, pre-tokenize and encode each piece on its
 * own. A cut made right after an added token is therefore a cut the tokenizer makes too, and the ids before it do
 * not depend on anything after it, provided that
 * - no added token strips the whitespace beside it (lstrip / rstrip), which would reach across the cut;
 * - added tokens are matched in the raw text (not normalized), the only matching this cache mirrors;
 * - no added token's text lies inside another's, so a match cannot start before the cut and end after it;
 * - the pre-tokenizer does not treat the text's first piece differently (Metaspace's prepend_scheme "first");
 * - the post-processor adds nothing (only encodings without special tokens are cached).
 * `prefixReuseObstacle` checks these on the tokenizer.json; a tokenizer that fails one is encoded whole, always.
 */

/** The parts of tokenizer.json the conditions above depend on. */
export interface PrefixReuseJson {
  normalizer?: unknown;
  pre_tokenizer?: unknown;
  added_tokens?: { id: number; content: string; special?: boolean; lstrip?: boolean; rstrip?: boolean; normalized?: boolean }[];
}

/** Why encodings of this tokenizer cannot be reused across a cut after an added token, or null when they can. */
export function prefixReuseObstacle(json: PrefixReuseJson): string | null {
  const added = json.added_tokens ?? [];
  for (const token of added) {
    if (token.lstrip || token.rstrip) return `added token ${JSON.stringify(token.content)} strips the whitespace beside it`;
    // The library's default: tokens not marked special are matched after normalization.
    const normalized = token.normalized ?? !(token.special ?? false);
    if (normalized && json.normalizer) return `added token ${JSON.stringify(token.content)} is matched in normalized text`;
    if (token.content.length === 0) return "an added token is empty";
  }
  for (const a of added) {
    for (const b of added) {
      if (a !== b && b.content !== a.content && b.content.includes(a.content)) {
        return `added token ${JSON.stringify(a.content)} lies inside ${JSON.stringify(b.content)}`;
      }
    }
  }
  if (JSON.stringify(json.pre_tokenizer ?? null).includes('"prepend_scheme":"first"')) return 'the pre-tokenizer treats the first piece differently (prepend_scheme "first")';
  return null;
}

interface Entry {
  text: string;
  ids: number[];
  /** After each added token of `text`: its end in characters and the number of ids up to and including it. */
  charEnds: number[];
  idEnds: number[];
  /** The key of the text up to each of those ends (see `#marks`). */
  keys: number[];
}

export interface PrefixCacheOptions {
  /** Texts kept (a GRPO step's concurrent conversations each need one). Default 256. */
  maxEntries?: number;
  /** Ids kept over all texts. Default 4M (about 50 MB with their texts). */
  maxIds?: number;
}

/** Encodes texts (without special tokens) through `encodeWhole`, reusing the ids of the longest cached prefix. */
export class PrefixEncodingCache {
  readonly #encodeWhole: (text: string) => number[];
  readonly #addedIds: Set<number>;
  /** The added tokens' texts by their first character's code, and which codes start one (a lookup per character). */
  readonly #addedByFirst = new Map<number, string[]>();
  readonly #startsToken = new Uint8Array(65536);
  readonly #maxEntries: number;
  readonly #maxIds: number;
  /** Least recently used first. */
  readonly #entries = new Map<string, Entry>();
  /** Each cached prefix that ends after an added token, by its key: a text holding it and the prefix's index there. */
  readonly #prefixes = new Map<number, { entry: Entry; mark: number }>();
  #ids = 0;
  /** Ids taken from the cache and ids encoded, over all calls. */
  readonly stats = { reusedIds: 0, encodedIds: 0 };

  constructor(encodeWhole: (text: string) => number[], addedTokens: { id: number; content: string }[], options: PrefixCacheOptions = {}) {
    this.#encodeWhole = encodeWhole;
    this.#addedIds = new Set(addedTokens.map((t) => t.id));
    for (const { content } of addedTokens) {
      const first = content.charCodeAt(0);
      this.#addedByFirst.set(first, [...(this.#addedByFirst.get(first) ?? []), content]);
      this.#startsToken[first] = 1;
    }
    this.#maxEntries = options.maxEntries ?? 256;
    this.#maxIds = options.maxIds ?? 4 * 1024 * 1024;
  }

  encode(text: string): number[] {
    const { charEnds, keys } = this.#marks(text);
    // The longest prefix of `text` that ends after an added token and is cached.
    let base: { entry: Entry; mark: number } | null = null;
    for (let i = charEnds.length - 1; i >= 0 && !base; i--) {
      const found = this.#prefixes.get(keys[i]);
      if (found && found.entry.charEnds[found.mark] === charEnds[i] && text.startsWith(found.entry.text.substring(0, charEnds[i]))) base = found;
    }
    const headChars = base ? base.entry.charEnds[base.mark] : 0, headIds = base ? base.entry.idEnds[base.mark] : 0;
    const tail = headChars === text.length ? [] : this.#encodeWhole(headChars === 0 ? text : text.slice(headChars));
    const ids = base ? base.entry.ids.slice(0, headIds).concat(tail) : tail;
    this.stats.reusedIds += headIds;
    this.stats.encodedIds += tail.length;

    // Equal prefixes hold equal added tokens, so the base's first marks are this text's too.
    const idEnds = base ? base.entry.idEnds.slice(0, base.mark + 1) : [];
    tail.forEach((id, i) => {
      if (this.#addedIds.has(id)) idEnds.push(headIds + i + 1);
    });
    // The ids' added tokens are the text's (they would differ only if the tokenizer split unlike `#marks`).
    const cacheable = idEnds.length === charEnds.length && charEnds.length > 0;
    if (base) {
      this.#touch(base.entry);
      // A cached text wholly inside this one is no longer needed: this one holds all its prefixes.
      if (cacheable && base.mark === base.entry.charEnds.length - 1 && text.startsWith(base.entry.text)) this.#remove(base.entry);
    }
    if (cacheable) this.#add({ text, ids, charEnds, idEnds, keys });
    // The caller may change what it gets; the cache keeps its own.
    return ids.slice();
  }

  /**
   * Where the added tokens of `text` end, found as the tokenizer finds them (leftmost; none lies inside another, so
   * at most one matches at a place), and for each end a key of the text before it: its length and a 32-bit polynomial
   * hash of its characters. Equal prefixes get equal keys; a match is confirmed by comparing the texts, so a
   * collision only costs a miss.
   */
  #marks(text: string): { charEnds: number[]; keys: number[] } {
    const charEnds: number[] = [], keys: number[] = [];
    const startsToken = this.#startsToken, byFirst = this.#addedByFirst, length = text.length;
    let hash = 0;
    for (let i = 0; i < length;) {
      const code = text.charCodeAt(i);
      const token = startsToken[code] === 1 ? byFirst.get(code)!.find((content) => text.startsWith(content, i)) : undefined;
      const end = token === undefined ? i + 1 : i + token.length;
      for (; i < end; i++) hash = (Math.imul(hash, 31) + text.charCodeAt(i)) | 0;
      if (token === undefined) continue;
      charEnds.push(end);
      keys.push(end * 4294967296 + (hash >>> 0));
    }
    return { charEnds, keys };
  }

  #touch(entry: Entry): void {
    this.#entries.delete(entry.text);
    this.#entries.set(entry.text, entry);
  }

  #add(entry: Entry): void {
    if (entry.ids.length > this.#maxIds) return;
    const previous = this.#entries.get(entry.text);
    if (previous) this.#remove(previous);
    this.#entries.set(entry.text, entry);
    this.#ids += entry.ids.length;
    entry.keys.forEach((key, mark) => this.#prefixes.set(key, { entry, mark }));
    for (const oldest of this.#entries.values()) {
      if (this.#entries.size <= this.#maxEntries && this.#ids <= this.#maxIds) break;
      this.#remove(oldest);
    }
  }

  #remove(entry: Entry): void {
    if (!this.#entries.delete(entry.text)) return;
    this.#ids -= entry.ids.length;
    for (const key of entry.keys) if (this.#prefixes.get(key)?.entry === entry) this.#prefixes.delete(key);
  }
}
