// Drives delegate with the official TypeScript MCP SDK client, a real client
// nobody on this project wrote. Usage:
//   node client.mjs stdio BINARY     (the environment is passed through)
//   node client.mjs http URL
// It prints one JSON object on stdout with what it saw; the Go test checks it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [mode, target] = process.argv.slice(2);
const transport = mode === "stdio"
  ? new StdioClientTransport({ command: target, args: ["serve"], env: process.env, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(target));

const client = new Client({ name: "delegate-e2e-ts", version: "1.0.0" });
await client.connect(transport);

const report = { protocol: transport.protocolVersion ?? null };
const tools = await client.listTools();
report.tools = tools.tools.map((t) => t.name).sort();

const structured = (res) => {
  if (res.isError) throw new Error(res.content.map((c) => c.text).join(""));
  return res.structuredContent;
};

const submitted = structured(await client.callTool({
  name: "submit_job",
  arguments: { manifest: { agentType: "custom", agent: { command: 'sleep 1; printf "task=%s\\n" "$DELEGATE_TASK"' }, task: "hello from TS; $(id)" } },
}));
report.submitted = submitted;

const progress = [];
const waited = structured(await client.callTool(
  { name: "wait_job", arguments: { job_id: submitted.job_id, timeout_seconds: 30 } },
  undefined,
  { onprogress: (p) => progress.push(p.message), timeout: 60000 },
));
report.waited = waited.status;
report.progress = progress;

const result = structured(await client.callTool({ name: "get_job_result", arguments: { job_id: submitted.job_id } }));
report.result = { status: result.status, exit_code: result.exit_code, output: result.output };

// Live logs: a streaming job followed with get_job_logs cursors, and a
// resource subscription that must bring notifications/resources/updated.
const updates = {};
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
  updates[n.params.uri] = (updates[n.params.uri] ?? 0) + 1;
});
const streaming = structured(await client.callTool({
  name: "submit_job",
  arguments: { manifest: { agentType: "script", statusMode: "streaming", task: "for i in 1 2 3 4; do echo tick $i; sleep 0.3; done" } },
}));
await client.subscribeResource({ uri: `job://${streaming.job_id}/log` });
let followed = "", cursor = "", whileRunning = false;
for (let i = 0; i < 200; i++) {
  const l = structured(await client.callTool({ name: "get_job_logs", arguments: { job_id: streaming.job_id, cursor } }));
  followed += l.output;
  if (l.output && l.status === "running") whileRunning = true;
  cursor = l.next_cursor;
  if (l.done) break;
  await new Promise((r) => setTimeout(r, 50));
}
await new Promise((r) => setTimeout(r, 200));
report.logs = { followed, whileRunning, logUpdates: updates[`job://${streaming.job_id}/log`] ?? 0 };

const bad = await client.callTool({ name: "submit_job", arguments: { manifest: { agentType: "script", task: "x", lifecycle: "forever" } } });
report.badError = bad.isError ? bad.content.map((c) => c.text).join("") : null;

await client.close();
process.stdout.write(JSON.stringify(report) + "\n");
