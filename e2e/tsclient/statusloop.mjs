// A get_job_status latency loop, for docs/BENCHMARKS.md: submits one long
// job, warms up with 500 calls, then makes N calls one at a time and
// prints p50 and p90 with the server's CPU and context switches per call
// (read from /proc, Linux only).
//
//   SERVER_CMD='["delegate","serve","--data-dir","/tmp/x"]' node statusloop.mjs
//   SERVER_CMD='["node","/tmp/tsorig/dist/index.js"]' TS_ORIGINAL=1 node statusloop.mjs
//
// By default the calls go through the official TypeScript MCP client.
// RAW=1 writes the JSON-RPC lines itself and reads the answers with one
// JSON.parse each: the server and the pipe, without the client's own
// work (its result parsing, and the validation of results against the
// tools' output schemas, which the client does after listing the tools;
// NO_LIST=1 skips only that). TS_ORIGINAL=1 submits in the TypeScript
// original's manifest shape.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { jobIdOf, longJob } from './jobs.mjs';

const [command, ...args] = JSON.parse(process.env.SERVER_CMD ?? '["delegate","serve"]');
const calls = Number(process.env.N ?? 10000);
const original = process.env.TS_ORIGINAL === '1';

// sdkCaller: the official client over its stdio transport.
async function sdkCaller() {
  const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: 'ignore' });
  const client = new Client({ name: 'statusloop', version: '1' });
  await client.connect(transport);
  if (process.env.NO_LIST !== '1') await client.listTools();
  return {
    pid: transport.pid,
    call: (name, args) => client.callTool({ name, arguments: args }),
    close: () => client.close(),
  };
}

// rawCaller: JSON-RPC lines on the child's stdin and stdout, nothing else.
async function rawCaller() {
  const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'ignore'], env: process.env });
  let buf = '';
  let waiting = null;
  child.stdout.on('data', (chunk) => {
    buf += chunk;
    for (let i; (i = buf.indexOf('\n')) >= 0;) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      let msg;
      try { msg = JSON.parse(line); } catch { continue; } // not JSON-RPC (the TS original prints a line)
      if (msg.id !== undefined && waiting) { const w = waiting; waiting = null; w(msg); }
    }
  });
  let id = 0;
  const rpc = (method, params) => new Promise((resolve) => {
    waiting = resolve;
    child.stdin.write(JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params }) + '\n');
  });
  await rpc('initialize', { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'statusloop', version: '1' } });
  child.stdin.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) + '\n');
  return {
    pid: child.pid,
    call: async (name, args) => (await rpc('tools/call', { name, arguments: args })).result,
    close: async () => child.kill(),
  };
}

const server = process.env.RAW === '1' ? await rawCaller() : await sdkCaller();
const id = jobIdOf(await server.call('submit_job', { manifest: longJob(original) }));

function serverCounters() {
  const stat = fs.readFileSync(`/proc/${server.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  const ticks = Number(stat[11]) + Number(stat[12]); // utime + stime
  let switches = 0;
  for (const tid of fs.readdirSync(`/proc/${server.pid}/task`)) {
    const status = fs.readFileSync(`/proc/${server.pid}/task/${tid}/status`, 'utf8');
    for (const m of status.matchAll(/ctxt_switches:\s+(\d+)/g)) switches += Number(m[1]);
  }
  return { ticks, switches };
}

const status = () => server.call('get_job_status', { job_id: id });
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
await server.close();
