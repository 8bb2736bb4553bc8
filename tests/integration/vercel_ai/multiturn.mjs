// The Vercel AI SDK's ordinary multi-turn pattern against a Responses server:
//   messages = [...history, ...result.response.messages, next]
// with the provider's default store: true, which sends earlier output back as item_reference.
// Runs generateText and streamText (HTTP), with a tool loop, and prints one JSON report:
// the texts, the request bodies the SDK sent, and any error.
//
// usage: node multiturn.mjs <base url, e.g. http://127.0.0.1:8000/v1>
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const baseURL = process.argv[2];
const bodies = [];
const openai = createOpenAI({
  baseURL,
  apiKey: "sk-local",
  fetch: async (url, init) => {
    if (init && typeof init.body === "string") bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const model = openai.responses("sim-1");

const tools = {
  exec_command: tool({
    description: "Run a shell command.",
    inputSchema: jsonSchema({
      type: "object",
      properties: { cmd: { type: "string" } },
      required: ["cmd"],
      additionalProperties: false,
    }),
    execute: async ({ cmd }) => `ran ${cmd}\nhello-from-the-tool`,
  }),
};

async function generateTurns() {
  const texts = [];
  let messages = [{ role: "user", content: "Say hello" }];
  for (const next of ["Again", "Run `echo hi` please", "And once more"]) {
    const result = await generateText({ model, messages, tools, stopWhen: stepCountIs(3) });
    texts.push(result.text);
    messages = [...messages, ...result.response.messages, { role: "user", content: next }];
  }
  const last = await generateText({ model, messages, tools, stopWhen: stepCountIs(3) });
  texts.push(last.text);
  return texts;
}

async function streamTurns() {
  const texts = [];
  let messages = [{ role: "user", content: "Stream hello" }];
  for (const next of ["Stream again", "Run `echo streamed` please", "Stream once more"]) {
    const result = streamText({ model, messages, tools, stopWhen: stepCountIs(3) });
    texts.push(await result.text);
    messages = [...messages, ...(await result.response).messages, { role: "user", content: next }];
  }
  const last = streamText({ model, messages, tools, stopWhen: stepCountIs(3) });
  texts.push(await last.text);
  return texts;
}

const report = { generate: null, stream: null, bodies, error: null };
try {
  report.generate = await generateTurns();
  report.stream = await streamTurns();
} catch (err) {
  report.error = String(err && (err.responseBody || err.message || err));
}
console.log(JSON.stringify(report));
