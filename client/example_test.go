package client_test

import (
	"context"
	"fmt"
	"log"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
)

// A program finds the API as the torpor command does (here through the
// client config file torpor up writes), then calls its services.
func Example() {
	ctx := context.Background()
	conn, err := client.Discover(client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(conn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
		Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "team-a"}},
	})); err != nil {
		log.Fatal(err)
	}
	spaces, err := c.Spaces.ListSpaces(ctx, connect.NewRequest(&torporv1.ListRequest{}))
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range spaces.Msg.GetSpaces() {
		fmt.Println(s.GetMetadata().GetName())
	}
	// Output:
	// default
	// team-a
}
