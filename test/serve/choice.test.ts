/**
 * How sampled tokens become an OpenAI choice: tool-call blocks to tool_calls, malformed blocks kept as text with
 * their reasons and a metric, and what a stream may send before a stop string or a tool call is decided.
 */
import fc from "fast-check";
import { beforeAll, describe, expect, it } from "vitest";
import type { Tokenizer } from "../../lib/model/tokenizer.ts";
import { ChoiceBuilder, type ServeMetrics } from "../../lib/serve/chat.ts";
import { parseChatRequest } from "../../lib/serve/request.ts";
import { tinyServableModel } from "./tiny-model.ts";

let tokenizer: Tokenizer;
beforeAll(async () => {
  tokenizer = (await tinyServableModel()).tokenizer;
});

const tool = { type: "function", function: { name: "move", parameters: { type: "object", properties: { cell: { type: "integer" } } } } };
const metrics = (): ServeMetrics => ({ requests: 0, promptTokens: 0, completionTokens: 0, malformedToolCalls: 0, aborted: 0 });

/** Feeds `text` as the model's tokens (then the end token) and returns the choice and the streamed deltas. */
function play(text: string, body: Record<string, unknown>, served = metrics()) {
  const request = parseChatRequest({ model: "m", messages: [{ role: "user", content: "go" }], ...body });
  const builder = new ChoiceBuilder(0, tokenizer, request, request.tools.length > 0 && request.toolChoice !== "none");
  const streamed: string[] = [];
  let stopped = false;
  for (const id of [...tokenizer.encode(text, { addSpecialTokens: false }), tokenizer.eosTokenIds[0]]) {
    const token = { id, logprob: -1, topLogprobs: [] };
    stopped = builder.push(token);
    streamed.push(builder.deltaChunk(token).delta.content ?? "");
    if (stopped) break;
  }
  const choice = builder.finish("stop", served);
  return { choice, streamed: streamed.join("") + builder.unsentContent(choice), sentBeforeEnd: streamed.join("") };
}

describe("choices from sampled tokens", () => {
  it("stream the same content a non-streamed answer holds, whatever text and tool calls are around it", () => {
    const call = '<tool_call>\n{"name": "move", "arguments": {"cell": 4}}\n</tool_call>';
    const part = fc.constantFrom("Sure.", "a b", " ", "\n", "\n\n", "  x  ", "<tool", "_call>", call, call, "</tool_call>", "done");
    fc.assert(fc.property(fc.array(part, { maxLength: 8 }), fc.boolean(), (parts, withTools) => {
      const { choice, streamed } = play(parts.join(""), withTools ? { tools: [tool] } : {});
      expect(streamed).toBe(choice.message.content ?? "");
    }), { seed: 20261125, numRuns: 300 });
  });

  it("a well-formed tool call becomes tool_calls with finish_reason tool_calls", () => {
    const { choice, streamed, sentBeforeEnd } = play('Thinking.\n<tool_call>\n{"name": "move", "arguments": {"cell": 4}}\n</tool_call>', { tools: [tool] });
    expect(choice.finish_reason).toBe("tool_calls");
    expect(choice.message.content).toBe("Thinking.");
    const call = choice.message.tool_calls![0];
    expect(call.type === "function" && [call.function.name, JSON.parse(call.function.arguments)]).toEqual(["move", { cell: 4 }]);
    expect(sentBeforeEnd).not.toContain("<tool_call");
    expect(streamed).toBe("Thinking.");
    expect(choice.token_ids!.at(-1)).toBe(tokenizer.eosTokenIds[0]);
  });

  it("a malformed tool call comes back as text, with its reason and a metric, never an error", () => {
    const served = metrics();
    const text = '<tool_call>\n{"name": "move", "arguments": {"cell": 4}\n</tool_call>';
    const { choice } = play(text, { tools: [tool] }, served);
    expect(choice.finish_reason).toBe("stop");
    expect(choice.message.content).toBe(text);
    expect(choice.message.tool_calls).toBeUndefined();
    expect(choice.tool_call_errors).toEqual([expect.stringMatching(/tool call 1: invalid JSON/)]);
    expect(served.malformedToolCalls).toBe(1);
  });

  it("without tools, tool-call text is plain content", () => {
    const { choice } = play('<tool_call>{"name": "move"}</tool_call>', {});
    expect(choice.message.content).toBe('<tool_call>{"name": "move"}</tool_call>');
    expect(choice.message.tool_calls).toBeUndefined();
  });

  it("stop strings cut the answer at the first place any of them starts, however the tokens split them", () => {
    const word = fc.constantFrom("ab", "a", "b", "ba", " ", "END", "EN", "D", "</", "<", "/", "x");
    fc.assert(fc.property(fc.array(word, { maxLength: 12 }), fc.subarray(["ab", "END", "</", "b a", "x"], { minLength: 1, maxLength: 4 }), (words, stop) => {
      const text = words.join("");
      const first = Math.min(...stop.map((s) => text.indexOf(s)).filter((at) => at >= 0), text.length);
      expect(play(text, { stop }).choice.message.content).toBe(text.slice(0, first));
    }), { numRuns: 300, seed: 7 });
  });

  it("a stream never sends the start of a stop string, and sends the same content as the whole answer", () => {
    const { choice, streamed, sentBeforeEnd } = play("alpha beta END gamma", { stop: ["END"] });
    expect(choice.message.content).toBe("alpha beta ");
    expect(streamed).toBe("alpha beta ");
    expect(sentBeforeEnd).not.toContain("E");
  });
});
