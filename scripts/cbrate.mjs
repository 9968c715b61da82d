#!/usr/bin/env node
// Callbacks as jobs send them: JOBS running jobs, CONNS connections each (each connection tied
// to one job), each job at RATE callbacks/s in all (under delegate's per-job 50/s). Reports the
// accepted (2xx) req/s, refusals, latency and the server's CPU per 1,000 accepted callbacks.
// Usage: SERVER_CMD=... [HARNESS_ADAPTER=./adapter-delegate.mjs DELEGATE_POOL=$JOBS] LABEL=x node cbrate.mjs
import autocannon from 'autocannon';
import { readFileSync } from 'node:fs';
import { loadAdapter, freePort, startServer, waitHttp, call, jobIdOf, sleep } from './lib.mjs';

const E = (k, d) => (process.env[k] !== undefined ? Number(process.env[k]) : d);
const JOBS = E('JOBS', 50), CONNS = E('CONNS', 2), RATE = E('RATE', 40), DURATION = E('DURATION', 10);
const label = process.env.LABEL || 'server';
const adapter = await loadAdapter();
const port = await freePort();
const srv = await startServer({ adapter, port, fakeEnv: {}, stderrFile: `/tmp/cbrate-${label}.stderr.log` });
const base = adapter.callbackBase(port);
await waitHttp(base + adapter.healthPath);

let pool;
if (adapter.callbackPool) {
  pool = await adapter.callbackPool(srv.client);
} else {
  pool = [];
  for (let i = 0; i < JOBS; i++) {
    const id = jobIdOf(await call(srv.client, adapter.tools.submit, adapter.submitArgs(i)));
    pool.push({ id, headers: await adapter.callbackHeaders(id, {}) });
  }
}
if (pool.length < JOBS) throw new Error(`only ${pool.length} of ${JOBS} jobs can send callbacks`);
await sleep(1000);

const cpu = () => { const f = readFileSync(`/proc/${srv.pid}/stat`, 'utf8').split(') ')[1].split(' '); return (Number(f[11]) + Number(f[12])) * 10; }; // ms at 100 Hz
let next = 0;
const cpu0 = cpu();
const res = await autocannon({
  url: base, connections: JOBS * CONNS, connectionRate: Math.max(1, Math.round(RATE / CONNS)), duration: DURATION,
  // Each connection is one job's for the whole run (a job's connections
  // carry its token only): setupClient, not setupRequest, whose context
  // autocannon resets after every request.
  setupClient: (client) => {
    const job = pool[next++ % JOBS];
    client.setRequests([{ method: 'POST', path: adapter.callbackPath(job.id, 'status'),
      headers: { 'content-type': 'application/json', ...job.headers }, body: JSON.stringify(adapter.statusBody(job.id)) }]);
  },
});
const cpuMs = cpu() - cpu0;
const ok = res['2xx'];
console.log(JSON.stringify({
  label, jobs: JOBS, connsPerJob: CONNS, ratePerJob: RATE, seconds: DURATION,
  offeredPerSec: JOBS * RATE, acceptedPerSec: Math.round(ok / DURATION), non2xx: res.non2xx, errors: res.errors, timeouts: res.timeouts,
  p50ms: res.latency.p50, p99ms: res.latency.p99, serverCpuMs: cpuMs, cpuMsPer1000: Math.round((cpuMs / Math.max(ok, 1)) * 1000 * 100) / 100,
}));
await srv.client.close().catch(() => {});
process.exit(0);
