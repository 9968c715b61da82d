// Package pve is delegate's own thin client for the Proxmox VE API: the
// few endpoints the Proxmox backend needs (cluster and node listings,
// clone, config, power, destroy, resize, tasks, and the QEMU guest agent),
// typed, with Proxmox's errors kept word for word.
//
// Wire facts it handles so callers need not:
//   - every answer is an envelope {"data": ...}; errors carry their message
//     in the HTTP reason phrase, and a 400 adds per-parameter "errors"
//     (APIError keeps all three);
//   - booleans travel as 0/1, GET /cluster/nextid answers a string, config
//     values come as numbers or strings (the Bool and Int types accept
//     both);
//   - long operations answer a task id (UPID) at once and run as tasks:
//     WaitTask polls them and turns a failed one into a *TaskError with the
//     tail of its log;
//   - bytes in JSON strings (exec output, file contents, stdin) are one
//     character per byte, as Proxmox's Perl writes and reads them; the
//     agent methods take and return []byte and do the mapping.
//
// Requests with a body are sent as JSON (PVE accepts it for POST and
// PUT), so arrays and empty strings arrive intact. Only GETs are
// retried, and any request that was never sent; a POST that may have
// reached the server (clone, start) is never repeated blindly.
package pve
