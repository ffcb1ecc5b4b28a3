/**
 * /v1/responses through openai-node's Responses client (create, and the stream helper that checks the event order
 * as it accumulates), in-process and over loopback HTTP.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IN_PROCESS_BASE_URL, ModelServer } from "../../lib/serve/model-server.ts";
import type { HttpServerHandle } from "../../lib/serve/http.ts";
import { tinyServableModel } from "./tiny-model.ts";

let server: ModelServer;
let http: HttpServerHandle;
const clients: Record<string, OpenAI> = {};
beforeAll(async () => {
  server = new ModelServer({ batcher: { numSlots: 8, maxPositions: 512 } });
  server.addBaseModel("tiny", await tinyServableModel(2));
  http = await server.listen();
  clients["in-process"] = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch, maxRetries: 0 });
  clients.http = new OpenAI({ baseURL: http.baseURL, apiKey: "local", maxRetries: 0 });
});
afterAll(() => server.close());

const weather = {
  type: "function" as const, name: "get_weather", description: "Current weather", strict: true,
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 10 } }, required: ["city"], additionalProperties: false },
};
const answerFormat = { type: "json_schema" as const, name: "answer", strict: true, schema: { type: "object", properties: { sky: { enum: ["sunny", "rainy"] } }, required: ["sky"], additionalProperties: false } };

for (const transport of ["in-process", "http"]) {
  describe(`/v1/responses (${transport})`, () => {
    it("answers text input with a message item, usage and status", async () => {
      const response = await clients[transport]!.responses.create({ model: "tiny", instructions: "Be brief.", input: "Hello there", max_output_tokens: 6 });
      expect(response).toMatchObject({ object: "response", model: "tiny", instructions: "Be brief.", max_output_tokens: 6 });
      expect(response.id).toMatch(/^resp_/);
      expect(["completed", "incomplete"]).toContain(response.status);
      expect(response.usage!.output_tokens).toBeGreaterThan(0);
      expect(response.usage!.total_tokens).toBe(response.usage!.input_tokens + response.usage!.output_tokens);
      expect(response.output_text).toBe(response.output.flatMap((item) => item.type === "message" ? item.content.map((c) => c.type === "output_text" ? c.text : "") : []).join(""));
    });

    it("calls a function tool, then takes its output as input items and answers in a json_schema format", async () => {
      const client = clients[transport]!;
      const first = await client.responses.create({ model: "tiny", input: [{ role: "user", content: [{ type: "input_text", text: "Weather in Oslo?" }] }], tools: [weather], tool_choice: "required", max_output_tokens: 60 });
      const call = first.output.find((item) => item.type === "function_call")!;
      expect(call).toMatchObject({ type: "function_call", name: "get_weather", status: "completed" });
      expect(call.type === "function_call" && call.call_id).toMatch(/^call_/);
      const args = JSON.parse(call.type === "function_call" ? call.arguments : "");
      expect(typeof args.city).toBe("string");
      const second = await client.responses.create({
        model: "tiny", tools: [weather], text: { format: answerFormat }, max_output_tokens: 40,
        input: [
          { role: "user", content: "Weather in Oslo?" },
          { type: "function_call", call_id: call.type === "function_call" ? call.call_id : "", name: "get_weather", arguments: call.type === "function_call" ? call.arguments : "" },
          { type: "function_call_output", call_id: call.type === "function_call" ? call.call_id : "", output: "rain all day" },
        ],
      });
      expect(["sunny", "rainy"]).toContain(JSON.parse(second.output_text).sky);
    });

    it("streams events the SDK's stream helper accepts, ending in the same response it accumulated", async () => {
      const stream = clients[transport]!.responses.stream({ model: "tiny", input: "Weather in Oslo?", tools: [weather], tool_choice: "required", max_output_tokens: 60 });
      const types: string[] = [];
      const sequence: number[] = [];
      let argumentsDelta = "";
      stream.on("event", (event) => {
        types.push(event.type);
        sequence.push(event.sequence_number);
        if (event.type === "response.function_call_arguments.delta") argumentsDelta += event.delta;
      });
      const final = await stream.finalResponse();
      expect(types[0]).toBe("response.created");
      expect(types.at(-1)).toBe("response.completed");
      expect(types).toContain("response.output_item.added");
      expect(types).toContain("response.function_call_arguments.done");
      expect(sequence).toEqual(sequence.map((_, i) => i));
      const call = final.output.find((item) => item.type === "function_call")!;
      expect(call.type === "function_call" && call.arguments).toBe(argumentsDelta);
      expect(JSON.parse(argumentsDelta)).toHaveProperty("city");

      const text = clients[transport]!.responses.stream({ model: "tiny", input: "Say something", max_output_tokens: 8 });
      let deltas = "";
      text.on("response.output_text.delta", (event) => (deltas += event.delta));
      expect((await text.finalResponse()).output_text).toBe(deltas);
    });
  });
}

describe("/v1/responses refuses what it cannot do, by name", () => {
  it("previous_response_id, non-function tools, image parts, unknown fields", async () => {
    const client = clients["in-process"]!;
    await expect(client.responses.create({ model: "tiny", input: "x", previous_response_id: "resp_1" })).rejects.toMatchObject({ status: 400, message: expect.stringMatching(/keeps no responses\. Send the whole conversation as input/) });
    await expect(client.responses.create({ model: "tiny", input: "x", tools: [{ type: "web_search" }] as never })).rejects.toMatchObject({ status: 400, param: "tools[0]" });
    await expect(client.responses.create({ model: "tiny", input: [{ role: "user", content: [{ type: "input_image", image_url: "x", detail: "auto" }] }] })).rejects.toMatchObject({ status: 400, param: "input[0].content[0]" });
    await expect(client.responses.create({ model: "tiny", input: "x", background: true })).rejects.toMatchObject({ status: 400, param: "background" });
    await expect(client.responses.create({ model: "nope", input: "x" })).rejects.toMatchObject({ status: 404 });
  });
});
