/**
 * A real, small byte-level BPE tokenizer for the tiny test checkpoints: the 256 byte tokens, merges learned
 * by a plain BPE trainer from an embedded corpus, Qwen's pre-tokenizer and special tokens, and a ChatML chat
 * template with tools. It loads in Python's `tokenizers`/transformers and in loadTokenizer alike, round-trips
 * any UTF-8 text, and is the same for the same options (the trainer breaks ties by token text).
 */
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { ArtError } from "../core/errors.ts";
import { BYTE_TO_CHAR } from "./tokenizer-bytes.ts";
import { TINY_TOKENIZER_CORPUS } from "./tokenizer-tiny-corpus.ts";

/** Qwen2/2.5/3's pre-tokenizer split: letters, single digits, punctuation runs, newlines, spaces. */
const QWEN_SPLIT_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const BYTE_LEVEL = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };

/** Special tokens in Qwen's order; the tool-call tags are added but not "special" (they survive skipSpecialTokens). */
export const TINY_SPECIAL_TOKENS: readonly { content: string; special: boolean }[] = [
  { content: "<|endoftext|>", special: true },
  { content: "<|im_start|>", special: true },
  { content: "<|im_end|>", special: true },
  { content: "<tool_call>", special: false },
  { content: "</tool_call>", special: false },
];

/** ChatML with Hermes-style tools, in the manner of Qwen2.5's template (own wording). */
export const TINY_CHAT_TEMPLATE = `{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nThese functions are available. Their JSON signatures are inside <tools></tools>:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + message.content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if message.content or not loop.first %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('this template knows the roles system, user, assistant and tool, not ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
`;

export interface TinyTokenizerOptions {
  /** Total vocabulary: 256 byte tokens + learned merges + the 5 special tokens. Default 512 (the corpus supports up to about 720). */
  vocabSize?: number;
  /**
   * Text to learn the merges from, in place of the embedded corpus: a task model's own traffic gives it whole
   * words, names and JSON keys as single tokens, so its conversations take a fraction of the byte-level length.
   */
  corpus?: string;
  /** The chat template (tokenizer_config.json's chat_template); default TINY_CHAT_TEMPLATE. */
  chatTemplate?: string;
}

const DEFAULT_VOCAB_SIZE = 512;

/** tokenizer.json, tokenizer_config.json and generation_config.json of the tiny tokenizer, as file texts. */
export function buildTinyTokenizerFiles(options: TinyTokenizerOptions = {}): Record<string, string> {
  const vocabSize = options.vocabSize ?? DEFAULT_VOCAB_SIZE;
  const minimum = 256 + TINY_SPECIAL_TOKENS.length;
  if (!Number.isInteger(vocabSize) || vocabSize < minimum) {
    throw new ArtError("tiny_tokenizer_options", `buildTinyTokenizerFiles: vocabSize must be an integer >= ${minimum} (256 bytes + ${TINY_SPECIAL_TOKENS.length} special tokens), got ${vocabSize}`);
  }
  const byteVocab: Record<string, number> = {};
  BYTE_TO_CHAR.forEach((char, byte) => (byteVocab[char] = byte));
  const preTokenize = corpusPreTokenizer(byteVocab);
  const wordCounts = new Map<string, number>();
  for (const word of preTokenize(options.corpus ?? TINY_TOKENIZER_CORPUS)) wordCounts.set(word, (wordCounts.get(word) ?? 0) + 1);

  const { vocab, merges } = trainBpe(wordCounts, byteVocab, vocabSize - TINY_SPECIAL_TOKENS.length);
  const firstSpecialId = Object.keys(vocab).length;
  const addedTokens = TINY_SPECIAL_TOKENS.map((token, i) => ({
    id: firstSpecialId + i,
    content: token.content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: token.special,
  }));
  const idOf = (content: string) => addedTokens.find((t) => t.content === content)!.id;

  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    ...pipeline(),
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
  const tokenizerConfig = {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: Object.fromEntries(addedTokens.map(({ id, ...token }) => [String(id), token])),
    additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    bos_token: null,
    chat_template: options.chatTemplate ?? TINY_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: "<|im_end|>",
    errors: "replace",
    model_max_length: 4096,
    pad_token: "<|endoftext|>",
    split_special_tokens: false,
    tokenizer_class: "Qwen2Tokenizer",
    unk_token: null,
  };
  const generationConfig = {
    bos_token_id: idOf("<|endoftext|>"),
    eos_token_id: [idOf("<|im_end|>"), idOf("<|endoftext|>")],
    pad_token_id: idOf("<|endoftext|>"),
  };
  return {
    "tokenizer.json": JSON.stringify(tokenizerJson),
    "tokenizer_config.json": `${JSON.stringify(tokenizerConfig, null, 2)}\n`,
    "generation_config.json": `${JSON.stringify(generationConfig, null, 2)}\n`,
  };
}

function pipeline() {
  return {
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [{ type: "Split", pattern: { Regex: QWEN_SPLIT_PATTERN }, behavior: "Isolated", invert: false }, BYTE_LEVEL],
    },
    post_processor: BYTE_LEVEL,
    decoder: BYTE_LEVEL,
  };
}

/** Splits text exactly as the finished tokenizer will, by running the same pipeline with no merges yet. */
function corpusPreTokenizer(byteVocab: Record<string, number>): (text: string) => string[] {
  const bare = new HfTokenizer({ added_tokens: [], ...pipeline(), model: { type: "BPE", vocab: byteVocab, merges: [] } }, {});
  const { normalizer, pre_tokenizer } = bare;
  if (!normalizer || !pre_tokenizer) throw new Error("tiny tokenizer pipeline lost its normalizer or pre-tokenizer");
  return (text) => pre_tokenizer(normalizer(text));
}

/**
 * Byte-pair encoding training: repeatedly merge the most frequent adjacent pair of symbols (ties: the pair
 * whose text sorts first) until the vocabulary has `targetSize` entries.
 */
export function trainBpe(
  wordCounts: Map<string, number>,
  initialVocab: Record<string, number>,
  targetSize: number,
): { vocab: Record<string, number>; merges: [string, string][] } {
  const vocab = { ...initialVocab };
  let size = Object.keys(vocab).length;
  const merges: [string, string][] = [];
  const words = [...wordCounts].map(([word, count]) => ({ symbols: Array.from(word), count }));
  while (size < targetSize) {
    const pairCounts = new Map<string, number>();
    for (const { symbols, count } of words) {
      for (let i = 0; i + 1 < symbols.length; i++) {
        const key = `${symbols[i]}\u0000${symbols[i + 1]}`;
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + count);
      }
    }
    let bestKey = "";
    let bestCount = 1;
    for (const [key, count] of pairCounts) {
      if (count > bestCount || (count === bestCount && bestCount > 1 && key < bestKey)) {
        bestKey = key;
        bestCount = count;
      }
    }
    if (bestCount < 2) {
      throw new ArtError("tiny_tokenizer_options", `the tokenizer corpus supports a vocabulary of ${size} tokens (+ special tokens), not ${targetSize}; ask for a smaller vocabSize or give a larger corpus`);
    }
    const [left, right] = bestKey.split("\u0000");
    const merged = left + right;
    merges.push([left, right]);
    if (!(merged in vocab)) vocab[merged] = size++;
    for (const word of words) word.symbols = mergePair(word.symbols, left, right, merged);
  }
  return { vocab, merges };
}

function mergePair(symbols: string[], left: string, right: string, merged: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < symbols.length; i++) {
    if (i + 1 < symbols.length && symbols[i] === left && symbols[i + 1] === right) {
      out.push(merged);
      i++;
    } else {
      out.push(symbols[i]);
    }
  }
  return out;
}
