//go:build linux && cgo

package local

/*
// -fno-plt: the C helpers call libc through the GOT, which the loader
// fills at start, not through the PLT, whose page (and the 52 KiB
// around it, the kernel's fault-around) a waiting helper would map
// again at each call after it gave the binary's pages back (lean_poll).
#cgo CFLAGS: -fno-plt
#include <stdlib.h>
const char *dsh_constants(void);
const char *dsh_job_path(const char *name, const char *envblock, int envlen, const char *dir, const char **pathenv);
const char *dsh_quote(const char *s);
const char *dsh_cgroups(int version, const char *memory, const char *cpu, const char *pids, long *ooms);
int write_pid_file(const char *name, const char *data, size_t n);
*/
import "C"

import (
	"strconv"
	"strings"
	"unsafe"
)

// haveCHelper: this binary has the C helpers (helper_linux.h), which
// take the sandboxes without network.
const haveCHelper = true

// cConstants is what helper_linux.h holds of this package's constants,
// for TestCHelperConstants.
func cConstants() string { return C.GoString(C.dsh_constants()) }

// cJobPath is init_linux.c's jobPath, for TestJobPath: the path found
// (or "") and the PATH searched.
func cJobPath(name string, env []string, dir string) (path, pathEnv string) {
	block := strings.Join(env, "\x00") + "\x00"
	cname, cblock, cdir := C.CString(name), C.CString(block), C.CString(dir)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cblock))
	defer C.free(unsafe.Pointer(cdir))
	var pe *C.char
	path = C.GoString(C.dsh_job_path(cname, cblock, C.int(len(block)), cdir, &pe))
	if pe != nil {
		pathEnv = C.GoString(pe)
	}
	return path, pathEnv
}

// cWritePIDFile is helper_linux.c's write_pid_file, for TestPIDFileWhole:
// name is in the working directory, as the helpers' are.
func cWritePIDFile(name string, pid int) error {
	cname, cdata := C.CString(name), C.CString(strconv.Itoa(pid))
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cdata))
	if rc, err := C.write_pid_file(cname, cdata, C.size_t(len(strconv.Itoa(pid)))); rc < 0 {
		return err
	}
	return nil
}

// cQuote is helper_linux.c's rendering of %q, for TestCQuote.
func cQuote(s string) string {
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	return C.GoString(C.dsh_quote(cs))
}

// cCgroups is what cgroup_linux.c makes of a cgroup set: its distinct
// directories and the OOM kills counted in the memory one.
func cCgroups(c cgroupSet) (dirs []string, ooms int) {
	cm, cc, cp := C.CString(c.Memory), C.CString(c.CPU), C.CString(c.Pids)
	defer C.free(unsafe.Pointer(cm))
	defer C.free(unsafe.Pointer(cc))
	defer C.free(unsafe.Pointer(cp))
	var n C.long
	out := C.GoString(C.dsh_cgroups(C.int(c.Version), cm, cc, cp, &n))
	return strings.Fields(out), int(n)
}
