// What the latency scripts (statusloop.mjs, statuspair.mjs) submit, and
// how they read the job id back, for delegate and for the TypeScript
// original alike.

// longJob is a job that runs while its status is asked, in the manifest
// shape of delegate or of the TS original (original).
export const longJob = (original) => (original
  ? { task: 'sleep', agentType: 'script', timeout: 3600 }
  : { agentType: 'script', task: 'sleep 600' });

// jobIdOf reads the id from a submit_job result: delegate's structured
// content, or the TS original's JSON text.
export function jobIdOf(result) {
  const text = JSON.parse(result.content?.[0]?.text ?? '{}');
  return result.structuredContent?.job_id ?? text.jobId ?? text.job_id;
}
