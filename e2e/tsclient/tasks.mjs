// Drives delegate as a Tasks client would: the official TypeScript client
// (@modelcontextprotocol/client 2.x, protocol 2026-07-28) with the Tasks
// extension's requester (@modelcontextprotocol/ext-tasks), which declares
// the extension on its requests, follows a task with tasks/get at the
// pollIntervalMs the server gives, and cancels it with tasks/cancel.
// Usage:
//   node tasks.mjs stdio BINARY COMMAND [ARG]   (the environment is passed through)
//   node tasks.mjs http URL COMMAND [ARG]
// Commands:
//   run SCRIPT       submit a job through the task session and settle it
//   insandbox ID SCRIPT
//                    the same, a command in kept sandbox ID
//   cancel           submit a long job, cancel it through tasks/cancel
//   submit SCRIPT    submit, print the task's reference (and the stdio
//                    server's pid), then wait for stdin to close
//   resume REF       resume a task from its reference and settle it
//   plain SCRIPT     the same client without the extension: submit_job,
//                    wait_job, get_job_result, as today
//   ask SCRIPT       a job that asks (SCRIPT may be a whole manifest, as
//                    JSON): the requester's onInputRequest
//                    answers each elicitation (an enum's last value, a
//                    number 7, true, "answered NAME") through tasks/update
//   unanswered SCRIPT TIMEOUT
//                    a job that asks, followed with tasks/get and never
//                    answered, until it ends (its timeout is TIMEOUT s)
// It prints one JSON object on stdout with what it saw (and what went over
// the wire: requests by method, messages and their bytes); the Go test
// checks it.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/client/validators/ajv";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const [mode, target, command, arg, arg2] = process.argv.slice(2);
const PROTOCOL = "2026-07-28";
const clientInfo = { name: "delegate-e2e-tasks", version: "1.0.0" };
const endpointId = "delegate-e2e"; // the same server across a restart, whatever its URL

const transport = mode === "stdio"
  ? new StdioClientTransport({ command: target, args: ["serve"], env: process.env, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(target));
const client = new Client(clientInfo, { versionNegotiation: { mode: { pin: PROTOCOL } } });
await client.connect(transport);

// What goes over the wire from here on: JSON-RPC messages, as sent and
// received (HTTP headers and SSE framing not counted).
// bytesByMethod counts each method's requests and responses together.
const wire = { requests: {}, sent: 0, received: 0, bytesSent: 0, bytesReceived: 0, bytesByMethod: {} };
const methodOf = new Map();
const countBytes = (method, n) => { if (method !== undefined) wire.bytesByMethod[method] = (wire.bytesByMethod[method] ?? 0) + n; };
const send = transport.send.bind(transport);
transport.send = async (message, options) => {
  const n = Buffer.byteLength(JSON.stringify(message));
  wire.sent++;
  wire.bytesSent += n;
  countBytes(message.method, n);
  if (message.method !== undefined && message.id !== undefined) {
    wire.requests[message.method] = (wire.requests[message.method] ?? 0) + 1;
    methodOf.set(message.id, message.method);
  }
  return send(message, options);
};

// rawDispatch sends the requests whose answers the client would refuse
// (a CreateTaskResult is no CallToolResult), on the client's own
// transport, with ids of its own, and hands their responses back before
// the client sees them.
const pending = new Map();
let rawIDs = 0;
const onmessage = transport.onmessage;
transport.onmessage = (message, extra) => {
  const n = Buffer.byteLength(JSON.stringify(message));
  wire.received++;
  wire.bytesReceived += n;
  countBytes(message.method ?? methodOf.get(message.id), n);
  if (message.method === undefined && pending.has(message.id)) {
    const resolve = pending.get(message.id);
    pending.delete(message.id);
    resolve(message);
    return;
  }
  onmessage?.call(transport, message, extra);
};
const rawDispatch = async (request, options = {}) => {
  const id = `raw-${++rawIDs}`;
  const reply = new Promise((resolve, reject) => {
    pending.set(id, resolve);
    options.signal?.addEventListener("abort", () => {
      pending.delete(id);
      reject(options.signal.reason);
    }, { once: true });
  });
  await transport.send({ jsonrpc: "2.0", id, method: request.method, params: request.params });
  const message = await reply;
  return message.error !== undefined ? { kind: "error", error: message.error } : { kind: "result", result: message.result };
};

const report = { protocol: client.getNegotiatedProtocolVersion() ?? null };
const { tools } = await client.listTools();
const submitTool = tools.find((t) => t.name === "submit_job");
report.advertised = client.getServerCapabilities()?.extensions?.["io.modelcontextprotocol/tasks"] ?? null;
// The validator the client checks structured output with by default.
const validate = new AjvJsonSchemaValidator().getValidator(submitTool.outputSchema);
const checkOutput = (structured) => {
  const v = validate(structured);
  return v.valid ? "valid" : v.errorMessage;
};

// A task, or (starting with "{") a whole manifest as JSON.
const manifest = (task, timeout = 600) => task.startsWith("{") ? { manifest: JSON.parse(task) } : ({ manifest: { agentType: "script", task, timeout } });

const session = (options = {}) => createTaskSessionFromClient(client, {
  endpointId,
  rawDispatch,
  v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities: {} },
  ...options,
});

// answerForm fills an elicitation's form as a person might.
const answerForm = (schema) => {
  const content = {};
  for (const [name, field] of Object.entries(schema?.properties ?? {})) {
    if (field.enum) content[name] = field.enum[field.enum.length - 1];
    else if (field.type === "boolean") content[name] = true;
    else if (field.type === "number" || field.type === "integer") content[name] = 7;
    else content[name] = `answered ${name}`;
  }
  return content;
};

// settle follows an execution to its end, noting every task status seen.
const settle = async (execution) => {
  report.kind = execution.kind;
  report.taskId = execution.handle?.taskId ?? null;
  const seen = [];
  const started = Date.now();
  const { outcome } = await execution.settle({
    onEvent: (event) => {
      if (event.type === "task") seen.push({ status: event.task.status, message: event.task.statusMessage ?? null, pollMs: event.task.suggestedPollIntervalMs ?? null });
    },
  });
  report.seconds = (Date.now() - started) / 1000;
  report.seen = seen;
  report.outcome = outcome.status;
  if (outcome.status === "completed") {
    report.isError = outcome.result.isError ?? false;
    report.result = outcome.result.structuredContent;
    report.textIsStructured = outcome.result.content?.[0]?.text === JSON.stringify(outcome.result.structuredContent);
    report.text = outcome.result.content?.[0]?.text ?? "";
    report.outputValidation = checkOutput(outcome.result.structuredContent);
  }
};

// What the job cost, from here on (connecting and the first tools/list
// not counted; the task session's own tools/list is).
const started = structuredClone(wire);
const minus = (now, then) => Object.fromEntries(Object.entries(now).map(([m, n]) => [m, n - (then[m] ?? 0)]).filter(([, n]) => n > 0));
const since = () => ({
  requests: minus(wire.requests, started.requests),
  sent: wire.sent - started.sent, received: wire.received - started.received,
  bytesSent: wire.bytesSent - started.bytesSent, bytesReceived: wire.bytesReceived - started.bytesReceived,
  bytesByMethod: minus(wire.bytesByMethod, started.bytesByMethod),
});

switch (command) {
  case "run": {
    const s = session();
    await settle(await s.callTool("submit_job", manifest(arg)));
    report.wire = since();
    await s.close();
    break;
  }
  case "insandbox": {
    const s = session();
    await settle(await s.callTool("submit_job", { manifest: { task: arg2, sandbox: arg, timeout: 600 } }));
    report.wire = since();
    await s.close();
    break;
  }
  case "cancel": {
    const s = session();
    const execution = await s.callTool("submit_job", manifest("echo started; sleep 300"));
    report.kind = execution.kind;
    report.taskId = execution.handle?.taskId ?? null;
    // Cancel once the job runs, then see where the task ends up.
    for (;;) {
      const r = await rawDispatch({ method: "tasks/get", params: framed({ taskId: report.taskId }) });
      if (r.result?.statusMessage?.startsWith("running")) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const t0 = Date.now();
    await s.cancelTask(report.taskId);
    for (;;) {
      const r = await rawDispatch({ method: "tasks/get", params: framed({ taskId: report.taskId }) });
      report.after = r.result ?? r.error;
      if (r.result?.status !== "working") break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    report.cancelSeconds = (Date.now() - t0) / 1000;
    // An id that is no job gets the specification's error.
    const unknown = await rawDispatch({ method: "tasks/get", params: framed({ taskId: "job-nope" }) });
    report.unknown = unknown.error ?? unknown.result;
    await s.close();
    break;
  }
  case "submit": {
    const s = session();
    const execution = await s.callTool("submit_job", manifest(arg));
    report.kind = execution.kind;
    // Hand over once the job runs: the server is to die mid-task.
    for (;;) {
      const r = await rawDispatch({ method: "tasks/get", params: framed({ taskId: execution.handle.taskId }) });
      if (r.result?.statusMessage?.startsWith("running")) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await execution.handoff((reference) => { report.reference = reference; });
    report.pid = transport.pid ?? null;
    process.stdout.write(JSON.stringify(report) + "\n");
    // Keep the connection (and a stdio server) until the test says.
    await new Promise((resolve) => { process.stdin.on("end", resolve); process.stdin.on("close", resolve); process.stdin.resume(); });
    process.exit(0);
  }
  case "resume": {
    const s = session();
    await settle(await s.resumeTask(JSON.parse(arg)));
    await s.close();
    break;
  }
  case "ask": {
    report.asked = [];
    const s = session({
      onInputRequest: async (request, context) => {
        report.asked.push({ kind: request.kind, inputId: context.inputId ?? null, taskId: context.taskId ?? null,
          message: request.params?.message ?? null, requestedSchema: request.params?.requestedSchema ?? null });
        return { action: "accept", content: answerForm(request.params?.requestedSchema) };
      },
    });
    await settle(await s.callTool("submit_job", manifest(arg)));
    report.wire = since();
    await s.close();
    break;
  }
  case "unanswered": {
    // Called and followed by hand: an ext-tasks execution answers an
    // elicitation it has no handler for with cancel, by itself.
    const call = await rawDispatch({ method: "tools/call", params: framed({ name: "submit_job", arguments: manifest(arg, Number(arg2)) }) });
    report.kind = call.result?.resultType ?? null;
    report.taskId = call.result?.taskId ?? null;
    report.seen = [];
    for (;;) {
      const r = await rawDispatch({ method: "tasks/get", params: framed({ taskId: report.taskId }) });
      const task = r.result ?? r.error;
      const last = report.seen[report.seen.length - 1];
      if (last?.status !== task.status) report.seen.push({ status: task.status, message: task.statusMessage ?? null, inputRequests: task.inputRequests ?? null });
      if (task.status !== "working" && task.status !== "input_required") {
        report.outcome = task.status;
        report.isError = task.result?.isError ?? false;
        report.result = task.result?.structuredContent ?? null;
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    break;
  }
  case "plain": {
    // callTool checks structured content against the output schema.
    const call = async (name, args) => {
      const res = await client.callTool({ name, arguments: args });
      if (res.isError) throw new Error(`${name}: ${res.content.map((c) => c.text).join("")}`);
      if (res.resultType === "task" || res.taskId !== undefined) throw new Error(`${name}: a task for a client that did not ask for one`);
      return res.structuredContent;
    };
    report.submitted = await call("submit_job", manifest(arg));
    report.outputValidation = checkOutput(report.submitted);
    let waited;
    do waited = await call("wait_job", { job_id: report.submitted.job_id }); while (!waited.done);
    report.result = await call("get_job_result", { job_id: report.submitted.job_id });
    report.wire = since();
    break;
  }
  default:
    throw new Error(`unknown command ${command}`);
}

// framed is what ext-tasks adds to its tasks/* requests: the 2026-07-28
// _meta, declaring the extension.
function framed(params) {
  return {
    ...params,
    _meta: {
      "io.modelcontextprotocol/protocolVersion": PROTOCOL,
      "io.modelcontextprotocol/clientInfo": clientInfo,
      "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
    },
  };
}

process.stdout.write(JSON.stringify(report) + "\n");
await client.close();
process.exit(0);
