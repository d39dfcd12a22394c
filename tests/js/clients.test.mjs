// memchat's OpenAI-compatible endpoint from JavaScript: the official `openai`
// package and the Vercel AI SDK (`ai` + `@ai-sdk/openai`), used as their
// documentation shows, against `memchat dev` with its offline responder (it
// answers "what is my name?" from what the prompt carries, so an answer that
// names the fact shows that memchat's memory brought an earlier call's turn).
//
// Run by tests/js/test_js_clients.py, which starts the server and passes
// MEMCHAT_URL and MEMCHAT_TOKENS (one fresh user per test, comma-separated).
import assert from "node:assert/strict";
import { test } from "node:test";

import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";
import OpenAI from "openai";

const baseURL = `${required("MEMCHAT_URL")}/v1`;
const tokens = required("MEMCHAT_TOKENS").split(",");

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/js/test_js_clients.py sets it)`);
  return value;
}

function nextToken() {
  const token = tokens.shift();
  if (!token) throw new Error("MEMCHAT_TOKENS has fewer tokens than the tests need");
  return token;
}

function client(apiKey = nextToken()) {
  return new OpenAI({ baseURL, apiKey, maxRetries: 0 });
}

const ask = (content) => [{ role: "user", content }];

test("openai: a later call is answered from an earlier one's memory", async () => {
  const openai = client();
  const first = await openai.chat.completions.create({
    model: "memchat",
    messages: ask("My name is Ana."),
  });
  assert.equal(first.object, "chat.completion");
  assert.equal(first.choices[0].finish_reason, "stop");
  assert.ok(first.memchat.session_id);

  const { data: second, response } = await openai.chat.completions
    .create({ model: "memchat", messages: ask("What is my name?") })
    .withResponse();
  assert.match(second.choices[0].message.content, /Your name is Ana/);
  assert.equal(response.headers.get("x-memchat-session-id"), first.memchat.session_id);
  assert.equal(second.memchat.memory.messages_in_context, 2);
  assert.equal(second.usage.total_tokens, second.usage.prompt_tokens + second.usage.completion_tokens);
});

test("openai: streaming with usage", async () => {
  const openai = client();
  await openai.chat.completions.create({ model: "memchat", messages: ask("My city is Lyon.") });
  const stream = await openai.chat.completions.create({
    model: "memchat",
    messages: ask("What is my city?"),
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? "";
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks > 3, `the answer came in pieces (${chunks} chunks)`);
  assert.match(text, /Your city is Lyon/);
  assert.equal(finish, "stop");
  // The usage chunk (the offline responder counts no tokens: zeros, as numbers).
  assert.ok(usage, "include_usage sends a usage chunk");
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
});

test("openai: errors are the SDK's own exceptions", async () => {
  await assert.rejects(
    client("not-a-token").chat.completions.create({ model: "memchat", messages: ask("hi") }),
    (error) => error instanceof OpenAI.AuthenticationError && error.status === 401 && error.code === "unauthorized",
  );
  const openai = client();
  await assert.rejects(
    openai.chat.completions.create({ model: "memchat", messages: ask("hi"), n: 2 }),
    (error) => error instanceof OpenAI.BadRequestError && error.param === "n",
  );
  await assert.rejects(
    openai.chat.completions.create({ model: "gpt-4o", messages: ask("hi") }),
    (error) => error instanceof OpenAI.NotFoundError && error.code === "model_not_found",
  );
  const models = await openai.models.list();
  assert.deepEqual(
    models.data.map((m) => m.id),
    ["memchat"],
  );
});

function vercelModel() {
  return createOpenAI({ baseURL, apiKey: nextToken() }).chat("memchat");
}

test("Vercel AI SDK: generateText remembers across calls", async () => {
  const model = vercelModel();
  await generateText({ model, prompt: "My name is Bea.", maxRetries: 0 });
  const { text, finishReason, usage } = await generateText({
    model,
    prompt: "What is my name?",
    maxRetries: 0,
  });
  assert.match(text, /Your name is Bea/);
  assert.equal(finishReason, "stop");
  assert.equal(typeof usage.outputTokens, "number");
});

test("Vercel AI SDK: streamText remembers across calls", async () => {
  const model = vercelModel();
  await generateText({ model, prompt: "My city is Oslo.", maxRetries: 0 });
  const result = streamText({ model, prompt: "What is my city?", maxRetries: 0 });
  const pieces = [];
  for await (const piece of result.textStream) pieces.push(piece);
  assert.ok(pieces.length > 3, `the answer came in pieces (${pieces.length})`);
  assert.match(pieces.join(""), /Your city is Oslo/);
  assert.equal(await result.finishReason, "stop");
});
