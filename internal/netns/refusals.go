package netns

// Refusals: the packets the slots' policies refuse are logged (a sample,
// at most refusalLogRate a second per slot; their exact count is each
// slot's counter, Denied) to the NFLOG group RefusalGroup, read here
// from the kernel's netlink ULOG subsystem.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The nfnetlink_log protocol (linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG   = 4
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulaPayload     = 9
	nfulnlCmdBind    = 1
	nfulnlCopyPacket = 2
)

// Refused is one refused packet: when, from which slot address, to where.
type Refused struct {
	Time     time.Time
	Src, Dst netip.Addr
	// Protocol is the IP protocol number; Port the destination port
	// (TCP, UDP), else 0.
	Protocol uint8
	Port     uint16
}

// Refusals calls fn with every refusal logged until ctx ends. Only one
// reader per group and host: a second gets an error.
func (n *Network) Refusals(ctx context.Context, fn func(Refused)) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("egress refusals: netlink: %w", err)
	}
	defer conn.Close()
	group := n.RefusalGroup()
	if err := configureLog(conn, group); err != nil {
		return fmt.Errorf("egress refusals: NFLOG group %d: %w", group, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for {
		msgs, err := conn.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var op *netlink.OpError
			if errors.As(err, &op) && errors.Is(op.Err, unix.ENOBUFS) {
				// Samples lost to a burst: the counters have them.
				continue
			}
			return fmt.Errorf("egress refusals: NFLOG group %d: %w", group, err)
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			if r, ok := parseLogged(m.Data[4:]); ok {
				fn(r)
			}
		}
	}
}

// configureLog binds conn to group, copying the packets' first bytes.
func configureLog(conn *netlink.Conn, group uint16) error {
	send := func(family uint8, attrs []netlink.Attribute) error {
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return err
		}
		head := []byte{family, 0 /* NFNETLINK_V0 */, byte(group >> 8), byte(group)}
		_, err = conn.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(head, b...),
		})
		return err
	}
	if err := send(unix.AF_INET, []netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCmdBind}}}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	mode := binary.BigEndian.AppendUint32(nil, refusalSnaplen)
	mode = append(mode, nfulnlCopyPacket, 0)
	if err := send(unix.AF_UNSPEC, []netlink.Attribute{{Type: nfulaCfgMode, Data: mode}}); err != nil {
		return fmt.Errorf("copy mode: %w", err)
	}
	return nil
}

// parseLogged reads a logged packet's attributes: its IPv4 header and
// ports.
func parseLogged(b []byte) (Refused, bool) {
	attrs, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		return Refused{}, false
	}
	for _, a := range attrs {
		if a.Type&^netlink.Nested == nfulaPayload {
			return parseIPv4(a.Data)
		}
	}
	return Refused{}, false
}

// parseIPv4 reads source, destination, protocol and destination port of
// an IPv4 packet's first bytes.
func parseIPv4(p []byte) (Refused, bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return Refused{}, false
	}
	ihl := int(p[0]&0x0f) * 4
	r := Refused{
		Time:     time.Now(),
		Src:      netip.AddrFrom4([4]byte(p[12:16])),
		Dst:      netip.AddrFrom4([4]byte(p[16:20])),
		Protocol: p[9],
	}
	if (r.Protocol == unix.IPPROTO_TCP || r.Protocol == unix.IPPROTO_UDP) && len(p) >= ihl+4 {
		r.Port = binary.BigEndian.Uint16(p[ihl+2 : ihl+4])
	}
	return r, true
}
