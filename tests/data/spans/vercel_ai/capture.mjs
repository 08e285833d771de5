// Capture the Vercel AI SDK's spans (ai 6, experimental_telemetry), offline, mock model.
//
//   cp capture.mjs ../../../typescript/ && cd ../../../typescript && npm ci && node capture.mjs OUT
//
// writes OUT/spans.jsonl (the scripted sequence of ../README.md) in the dump format: every
// finished span in end order, with what the span processor's onStart saw.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { generateText, jsonSchema, stepCountIs, tool } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';

const KINDS = ['INTERNAL', 'SERVER', 'CLIENT', 'PRODUCER', 'CONSUMER'];
const CODES = ['UNSET', 'OK', 'ERROR'];
const ns = ([seconds, nanos]) => (BigInt(seconds) * 1000000000n + BigInt(nanos)).toString();

class Recorder {
  constructor() {
    this.records = [];
    this.starts = new Map();
  }
  onStart(span) {
    this.starts.set(span.spanContext().spanId, [span.name, { ...span.attributes }]);
  }
  onEnding() {}
  onEnd(span) {
    const context = span.spanContext();
    const [name0, attrs0] = this.starts.get(context.spanId) ?? [null, {}];
    this.starts.delete(context.spanId);
    this.records.push({
      name: span.name,
      kind: KINDS[span.kind],
      trace_id: context.traceId,
      span_id: context.spanId,
      parent_span_id: span.parentSpanContext?.spanId ?? null,
      scope: span.instrumentationScope?.name ?? null,
      start_time_ns: ns(span.startTime),
      end_time_ns: ns(span.endTime),
      attributes: { ...span.attributes },
      events: span.events.map(e => ({ name: e.name, timestamp_ns: ns(e.time), attributes: { ...(e.attributes ?? {}) } })),
      status: { code: CODES[span.status.code], description: span.status.message ?? null },
      name_at_start: name0,
      attributes_at_start: attrs0,
    });
  }
  forceFlush() { return Promise.resolve(); }
  shutdown() { return Promise.resolve(); }
}

const SCRIPT = [
  ...Array(6).fill(['search', { query: 'weather in Paris' }]),
  ['get_weather', { city: 'Paris', unit: 'C' }],
  ['search', { query: 'weather in Paris' }],
];
const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};
let turn = 0;
const model = new MockLanguageModelV3({
  doGenerate: async () => {
    const step = SCRIPT[turn];
    const id = `call_${turn}`;
    turn += 1;
    if (step === undefined) {
      return { content: [{ type: 'text', text: 'It is sunny in Paris.' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] };
    }
    return {
      content: [{ type: 'tool-call', toolCallId: id, toolName: step[0], input: JSON.stringify(step[1]) }],
      finishReason: { unified: 'tool-calls', raw: undefined },
      usage,
      warnings: [],
    };
  },
});

const recorder = new Recorder();
const sdk = new NodeSDK({ serviceName: 'capture', spanProcessors: [recorder] });
sdk.start();
await generateText({
  model,
  tools: {
    search: tool({
      description: 'Search the web.',
      inputSchema: jsonSchema({ type: 'object', properties: { query: { type: 'string' } }, required: ['query'] }),
      execute: async ({ query }) => `results for '${query}': nothing useful`,
    }),
    get_weather: tool({
      description: 'Get weather for a city.',
      inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city', 'unit'] }),
      execute: async ({ city, unit }) => `${city}: sunny, 21${unit}`,
    }),
  },
  prompt: "What's the weather in Paris?",
  stopWhen: stepCountIs(SCRIPT.length + 1),
  experimental_telemetry: { isEnabled: true, functionId: 'weather_agent' },
});
await sdk.shutdown();
const lines = recorder.records.map(r => JSON.stringify(r).replace(/"(start_time_ns|end_time_ns|timestamp_ns)":"(\d+)"/g, '"$1":$2'));
writeFileSync(join(process.argv[2], 'spans.jsonl'), lines.join('\n') + '\n');
