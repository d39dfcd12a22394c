// Chat front ends' calls from JavaScript, with the official `openai` package,
// against `memchat dev` backed by the tests' fake model (which records every
// request it gets: tests/js/test_js_clients.py checks what reached it).
//
// Two chats of one user at once, each with its chat id (as Open WebUI sends
// it) and its whole history on every call, with max_tokens and temperature;
// then suggested follow-ups, whole and streamed.
import assert from "node:assert/strict";
import { test } from "node:test";

import OpenAI from "openai";

const baseURL = `${required("MEMCHAT_URL")}/v1`;
const token = required("MEMCHAT_TOKEN");

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (tests/js/test_js_clients.py sets it)`);
  return value;
}

async function talk(name, chatId) {
  const openai = new OpenAI({ baseURL, apiKey: token, maxRetries: 0, defaultHeaders: { "X-OpenWebUI-Chat-Id": chatId } });
  const messages = [];
  const sessions = new Set();
  for (let turn = 0; turn < 3; turn += 1) {
    messages.push({ role: "user", content: `${name}: message ${turn}` });
    const { data, response } = await openai.chat.completions
      .create({ model: "memchat", messages, max_tokens: 32, temperature: 0.7 })
      .withResponse();
    assert.equal(data.choices[0].message.content, `echo: ${name}: message ${turn}`);
    messages.push({ role: "assistant", content: data.choices[0].message.content });
    sessions.add(response.headers.get("x-memchat-session-id"));
  }
  return [...sessions];
}

test("two chats at once keep their own sessions", async () => {
  const ids = { alpha: "2b4e7c2e-7a4c-4c8e-9a52-2d1f6f0a0001", beta: "2b4e7c2e-7a4c-4c8e-9a52-2d1f6f0a0002" };
  const [alpha, beta] = await Promise.all([talk("alpha", ids.alpha), talk("beta", ids.beta)]);
  assert.deepEqual(alpha, [ids.alpha]);
  assert.deepEqual(beta, [ids.beta]);
});

test("suggested follow-ups, whole and streamed", async () => {
  const openai = new OpenAI({ baseURL, apiKey: token, maxRetries: 0 });
  const messages = [{ role: "user", content: "Tell me about Oslo" }];
  const whole = await openai.chat.completions.create({ model: "memchat", messages, memchat: { suggest: true } });
  assert.equal(whole.memchat.suggestions.length, 3);
  const stream = await openai.chat.completions.create({
    model: "memchat",
    messages,
    stream: true,
    memchat: { suggest: true },
  });
  const found = [];
  for await (const chunk of stream) if (chunk.memchat?.suggestions) found.push(chunk.memchat.suggestions);
  assert.deepEqual(found, [whole.memchat.suggestions]);
});
