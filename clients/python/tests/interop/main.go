// Command interop is the Go side of the Python client's interop test
// (clients/python/tests/test_interop.py): it writes and reads records with
// fenced's Go client, so that the test can check that each client reads what
// the other wrote, byte for byte.
//
//	interop ADDR SLUG put SECTION KEY VALUE   prints the committed revision
//	interop ADDR SLUG get SECTION KEY         prints {"revision":N,"value":"..."} or null
//	interop descriptors                       writes the FileDescriptorSet of package fenced.v1 (binary)
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/agentihooks/fenced/client"
	_ "github.com/agentihooks/fenced/proto/fenced/v1" // registers the fenced.v1 files
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 1 && args[0] == "descriptors" {
		// Every file of package fenced.v1 (all registered by importing fencedv1).
		set := &descriptorpb.FileDescriptorSet{}
		protoregistry.GlobalFiles.RangeFilesByPackage("fenced.v1", func(fd protoreflect.FileDescriptor) bool {
			set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
			return true
		})
		b, err := proto.Marshal(set)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	}
	if len(args) < 5 {
		return fmt.Errorf("usage: interop ADDR SLUG put SECTION KEY VALUE | get SECTION KEY")
	}
	addr, slug, op, section, key := args[0], args[1], args[2], args[3], args[4]
	c, err := client.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch op {
	case "put":
		if len(args) != 6 {
			return fmt.Errorf("put needs a value")
		}
		// Update: the record is read, then put expecting that revision.
		rev, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			return tx.Put(section, key, json.RawMessage(args[5]))
		})
		if err != nil {
			return err
		}
		fmt.Println(rev)
	case "get":
		rec, _, err := c.Get(ctx, slug, section, key)
		if err != nil {
			return err
		}
		var out any
		if rec != nil {
			out = map[string]any{"revision": rec.Revision, "value": string(rec.Value)}
		}
		return json.NewEncoder(os.Stdout).Encode(out)
	default:
		return fmt.Errorf("unknown operation %q", op)
	}
	return nil
}
