//go:build !unix

package mcpserver

import (
	"errors"
	"os"
)

// pollable: only Unix pipes and sockets are read through the poller.
func pollable(*os.File) (*os.File, func(), error) {
	return nil, nil, errors.New("not on this system")
}
