// The load generator's own ceiling, for docs/BENCHMARKS.md: autocannon
// with the seed harness's callback setup (POST, a JSON body, 50
// connections, 10 s, paths rotating over 100 job ids) against any URL,
// such as the trivial Go handler of e2e/ceiling:
//
//   go run ./e2e/ceiling 127.0.0.1:9000 &
//   HARNESS=/tmp/harness node e2e/tsclient/ceiling.mjs http://127.0.0.1:9000
//
// autocannon is taken from the harness's node_modules (HARNESS).
import { createRequire } from 'node:module';

const harness = process.env.HARNESS ?? '/tmp/harness';
const autocannon = createRequire(harness + '/')('autocannon');
const url = process.argv[2] ?? 'http://127.0.0.1:9000';
let k = 0;
const res = await autocannon({
  url, connections: Number(process.env.CB_CONNECTIONS ?? 50), duration: Number(process.env.CB_DURATION ?? 10),
  requests: [{
    method: 'POST',
    setupRequest: (req) => {
      const id = `job-${k++ % 100}`;
      return { ...req, path: `/callback/${id}/status`, headers: { 'content-type': 'application/json', authorization: 'Bearer x' },
        body: JSON.stringify({ job_id: id, progress: 'step 3/10', output: 'partial output line' }) };
    },
  }],
});
console.log(`ceiling: ${Math.round(res.requests.average)} req/s (p50 latency ${res.latency.p50} ms, non-2xx ${res.non2xx})`);
