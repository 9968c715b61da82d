// Runs a plan of MCP operations as one principal (a bearer token) over
// Streamable HTTP, and prints what each answered: the official TypeScript
// client 1.x (protocol 2025-11-25) for tools, resources and
// subscriptions, and the 2.x client (protocol 2026-07-28, the Tasks
// extension declared) for the task methods. Usage:
//   node principals.mjs URL TOKEN PLAN
// PLAN is a JSON list of steps: {"op":"tool","name":…,"args":{…}},
// {"op":"read","uri":…}, {"op":"subscribe","uri":…}, or a task method
// {"op":"tasks/get","params":{"taskId":…}} (tasks/cancel, tasks/update).
// It prints a JSON list, one {"result":…} or {"error":"…"} a step.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Client as Client2, StreamableHTTPClientTransport as Transport2 } from "@modelcontextprotocol/client";

const [url, token, plan] = process.argv.slice(2);
const requestInit = { headers: { Authorization: `Bearer ${token}` } };

const client = new Client({ name: "delegate-e2e-principals", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit }));

// The task methods go as raw requests of a 2026-07-28 client, their
// answers taken off its transport before the client sees them.
const PROTOCOL = "2026-07-28";
const clientInfo = { name: "delegate-e2e-principals", version: "1.0.0" };
let raw;
const rawRequest = async (method, params) => {
  if (raw === undefined) {
    const transport = new Transport2(new URL(url), { requestInit });
    const c = new Client2(clientInfo, { versionNegotiation: { mode: { pin: PROTOCOL } } });
    await c.connect(transport);
    const pending = new Map();
    const onmessage = transport.onmessage;
    transport.onmessage = (message, extra) => {
      if (message.method === undefined && pending.has(message.id)) {
        pending.get(message.id)(message);
        pending.delete(message.id);
        return;
      }
      onmessage?.call(transport, message, extra);
    };
    raw = { c, transport, pending, n: 0 };
  }
  const id = `raw-${++raw.n}`;
  const reply = new Promise((resolve) => raw.pending.set(id, resolve));
  await raw.transport.send({
    jsonrpc: "2.0", id, method,
    params: {
      ...params,
      _meta: {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": clientInfo,
        "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
      },
    },
  });
  const m = await reply;
  if (m.error !== undefined) throw Object.assign(new Error(m.error.message), { code: m.error.code });
  return m.result;
};

const out = [];
for (const step of JSON.parse(plan)) {
  try {
    switch (step.op) {
      case "tool": {
        const r = await client.callTool({ name: step.name, arguments: step.args }, undefined, { timeout: 120000 });
        out.push(r.isError ? { error: r.content.map((c) => c.text).join("") } : { result: r.structuredContent ?? r.content });
        break;
      }
      case "read":
        out.push({ result: await client.readResource({ uri: step.uri }) });
        break;
      case "subscribe":
        out.push({ result: await client.subscribeResource({ uri: step.uri }) });
        break;
      default:
        out.push({ result: await rawRequest(step.op, step.params) });
    }
  } catch (e) {
    out.push({ error: `${e.code ?? ""} ${e.message}` });
  }
}
await client.close();
await raw?.c.close();
process.stdout.write(JSON.stringify(out) + "\n");
