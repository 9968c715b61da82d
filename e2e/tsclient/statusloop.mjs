// A get_job_status latency loop through the official TypeScript MCP client,
// for docs/BENCHMARKS.md: submits one long job, warms up with 500 calls,
// then makes N calls one at a time and prints p50 and p90 with the server's
// CPU and context switches per call (read from /proc, Linux only).
//
//   SERVER_CMD='["delegate","serve","--data-dir","/tmp/x"]' node statusloop.mjs
//   SERVER_CMD='["node","/tmp/tsorig/dist/index.js"]' TS_ORIGINAL=1 node statusloop.mjs
//
// TS_ORIGINAL=1 submits in the TypeScript original's manifest shape.
import fs from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const [command, ...args] = JSON.parse(process.env.SERVER_CMD ?? '["delegate","serve"]');
const calls = Number(process.env.N ?? 10000);
const original = process.env.TS_ORIGINAL === '1';

const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: 'ignore' });
const client = new Client({ name: 'statusloop', version: '1' });
await client.connect(transport);
// Listing the tools makes the client validate every result against its
// output schema (the TS original declares none); NO_LIST=1 skips that.
if (process.env.NO_LIST !== "1") await client.listTools();

const manifest = original
  ? { task: 'sleep', agentType: 'script', timeout: 3600 }
  : { agentType: 'script', task: 'sleep 300' };
const submitted = await client.callTool({ name: 'submit_job', arguments: { manifest } });
const text = submitted.content?.[0]?.text ?? '{}';
const id = submitted.structuredContent?.job_id ?? JSON.parse(text).jobId ?? JSON.parse(text).job_id;

function serverCounters() {
  const pid = transport.pid;
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  const ticks = Number(stat[11]) + Number(stat[12]); // utime + stime
  let switches = 0;
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    const status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
    for (const m of status.matchAll(/ctxt_switches:\s+(\d+)/g)) switches += Number(m[1]);
  }
  return { ticks, switches };
}

const status = () => client.callTool({ name: 'get_job_status', arguments: { job_id: id } });
for (let i = 0; i < 500; i++) await status();
const before = serverCounters();
const took = [];
for (let i = 0; i < calls; i++) {
  const t0 = performance.now();
  await status();
  took.push(performance.now() - t0);
}
const after = serverCounters();
took.sort((a, b) => a - b);
const tickUs = 1e6 / 100; // USER_HZ
console.log(`p50 ${took[calls >> 1].toFixed(3)} ms  p90 ${took[Math.floor(calls * 0.9)].toFixed(3)} ms  ` +
  `server CPU ${(((after.ticks - before.ticks) * tickUs) / calls).toFixed(0)} µs/call  ` +
  `context switches ${((after.switches - before.switches) / calls).toFixed(2)}/call`);
await client.close();
