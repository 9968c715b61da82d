// statuspair: get_job_status latency of several servers measured in one
// run, in blocks of calls to each server in turn, so that whatever else
// the machine does falls on all of them alike (on a 2-core VM a figure
// moves by ±30 % from one minute to the next; a comparison in turn does
// not).
//
//   SERVERS='[{"label":"delegate","cmd":["delegate","serve","--data-dir","/tmp/x"]},
//             {"label":"ts","cmd":["node","/tmp/tsorig/dist/index.js"],"original":true}]' node statuspair.mjs
//
// Each server is reached through the official TypeScript MCP client over
// stdio, which lists the tools first (and so validates results against
// their output schemas, as a client does), submits one long job, warms up
// with 500 calls, then asks its status N times (10,000) in blocks of BLOCK
// (250). Prints p50 and p90 per server and each p50 divided by the first
// server's. A server's "env" is added to its environment. BG, a manifest
// in JSON, is submitted to each delegate first, to run beside the calls
// (a job flooding its status file, say).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { jobIdOf, longJob } from './jobs.mjs';

const servers = JSON.parse(process.env.SERVERS);
const calls = Number(process.env.N ?? 10000);

async function connect(s) {
  const [command, ...args] = s.cmd;
  const transport = new StdioClientTransport({ command, args, env: { ...process.env, ...(s.env ?? {}) }, stderr: 'ignore' });
  const client = new Client({ name: 'statuspair', version: '1' });
  await client.connect(transport);
  await client.listTools();
  if (process.env.BG && !s.original) await client.callTool({ name: 'submit_job', arguments: { manifest: JSON.parse(process.env.BG) } });
  const id = jobIdOf(await client.callTool({ name: 'submit_job', arguments: { manifest: longJob(s.original) } }));
  return { ...s, client, status: () => client.callTool({ name: 'get_job_status', arguments: { job_id: id } }), took: [] };
}

const conns = [];
for (const s of servers) conns.push(await connect(s));
for (let i = 0; i < 500; i++) for (const c of conns) await c.status();
// Blocks of calls to one server, the servers in turn: within a block a
// server is as warm as in a loop of its own; across blocks, a slow minute
// falls on every server alike.
const block = Number(process.env.BLOCK ?? 250);
for (let i = 0; i < calls; i += block) {
  for (let k = 0; k < conns.length; k++) {
    const c = conns[(i / block + k) % conns.length]; // each server goes first in turn
    for (let j = 0; j < block; j++) {
      const t0 = performance.now();
      await c.status();
      c.took.push(performance.now() - t0);
    }
  }
}
const p = (a, q) => a[Math.floor(a.length * q)];
let base;
for (const c of conns) {
  c.took.sort((a, b) => a - b);
  const p50 = p(c.took, 0.5);
  base ??= p50;
  console.log(`${c.label.padEnd(14)} p50 ${p50.toFixed(3)} ms  p90 ${p(c.took, 0.9).toFixed(3)} ms  ÷first ${(p50 / base).toFixed(2)}`);
}
for (const c of conns) await c.client.close();
