// A TypeScript agent that loops on one tool: the Vercel AI SDK's generateText with its mock
// language model, telemetry on (experimental_telemetry), spans exported over OTLP/HTTP by the
// OpenTelemetry Node SDK. Run by tests/test_typescript_agent.py:
//
//   node agent.mjs OTLP_URL CALLS MODE PROTOCOL
//
// The model calls `search` with the same arguments CALLS times, then answers. MODE: "generate"
// (generateText), "stream" (streamText) or "fail" (generateText, and `search` throws).
// PROTOCOL: "http" (OTLP/HTTP protobuf to OTLP_URL, the traces path included) or "grpc"
// (OTLP/gRPC to OTLP_URL). Prints one JSON line: the answer, the steps and how many times the
// tool ran.
import { NodeSDK } from '@opentelemetry/sdk-node';
import { OTLPTraceExporter as GrpcExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { OTLPTraceExporter as HttpExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';

const [url, callsText, mode, protocol] = process.argv.slice(2);
const calls = Number(callsText);
const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};
const query = { query: 'weather in Paris' };

const sdk = new NodeSDK({
  serviceName: 'typescript-agent',
  traceExporter: protocol === 'grpc' ? new GrpcExporter({ url }) : new HttpExporter({ url }),
});
sdk.start();

let turns = 0;
function nextContent() {
  turns += 1;
  if (turns <= calls) {
    return {
      content: [
        { type: 'tool-call', toolCallId: `call-${turns}`, toolName: 'search', input: JSON.stringify(query) },
      ],
      finishReason: { unified: 'tool-calls', raw: undefined },
    };
  }
  return {
    content: [{ type: 'text', text: 'I could not find more than the first result said.' }],
    finishReason: { unified: 'stop', raw: undefined },
  };
}

function streamOf({ content, finishReason }) {
  const chunks = [];
  for (const part of content) {
    if (part.type === 'tool-call') {
      chunks.push(part);
    } else {
      chunks.push({ type: 'text-start', id: 't' });
      chunks.push({ type: 'text-delta', id: 't', delta: part.text });
      chunks.push({ type: 'text-end', id: 't' });
    }
  }
  chunks.push({ type: 'finish', finishReason, usage });
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
}

const model = new MockLanguageModelV3({
  doGenerate: async () => ({ ...nextContent(), usage, warnings: [] }),
  doStream: async () => ({ stream: streamOf(nextContent()) }),
});

let runs = 0;
const tools = {
  search: tool({
    description: 'Search the web.',
    inputSchema: jsonSchema({
      type: 'object',
      properties: { query: { type: 'string' } },
      required: ['query'],
    }),
    execute: async ({ query: text }) => {
      runs += 1;
      if (mode === 'fail') throw new Error('search backend unavailable');
      return `results for '${text}': nothing useful`;
    },
  }),
};

const options = {
  model,
  tools,
  prompt: "What's the weather in Paris?",
  stopWhen: stepCountIs(calls + 1),
  experimental_telemetry: { isEnabled: true, functionId: 'weather-agent' },
};
let text;
let steps;
if (mode === 'stream') {
  const result = streamText(options);
  await result.consumeStream(); // the whole stream read: the ai.streamText span ends with it
  text = await result.text;
  steps = (await result.steps).length;
} else {
  const result = await generateText(options);
  text = result.text;
  steps = result.steps.length;
}
await sdk.shutdown();
console.log(JSON.stringify({ text, steps, runs }));
