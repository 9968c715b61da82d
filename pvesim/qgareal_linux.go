package pvesim

import "golang.org/x/sys/unix"

// dirFlags open a directory only to name it (/proc/self/fd/N/...).
const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW
