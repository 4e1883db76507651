#!/bin/bash
# lab: guests=1 timeout=330
# lab: gotest=./pkg/rvma
#
# pkg/rvma on one guest, loopback on rxe0: the verbs the design relies on
# (type 1 memory windows bound and unbound per buffer, WRITE WITH IMMEDIATE
# into an SRQ without scatter lists, refused writes seen on both sides,
# zero-length knocks), then the receiving engine: striped puts in reverse
# order through six epochs with the bytes checked, and a stale write
# refused without touching any buffer; then the endpoint through its public
# API, putting to its own address over four rdma_cm stripes: epochs filled
# in forward, reverse and random order, puts from Go memory (copied, more
# in flight than the endpoint has bounce chunks), ErrTooLarge, ErrNoMailbox,
# ErrNoBuffer at the deadline, IncEpoch, NACK and silent close, misuse,
# Get, control messages lost on the way (sent again by the asker), two
# senders overshooting shared epochs (late puts reported to their senders),
# two senders keeping a promised share of each epoch without notices (and
# one breaking the promise: refused as stale, retried, nothing changed),
# stripe replacements seen from the accepting side (puts wait for a
# replacement's Accept; a stripe the dialer never replaces fails the link),
# and where notices travel (over the receiver's own link to a peer it also
# puts to, and back when that link fails; a three-endpoint halo exchange
# without a stale put), and puts flushed by a stripe failure that was not
# a refusal (failed with the link, never issued twice), and a Spin ping-pong
# between two goroutines on the two CPUs (a record seen before the module
# raised its done counter).
# (TestLabEngineLatency prints figures and is left to benchmarks.)
# The endpoint tests run twice: with the kernel module counting puts (plain
# WRITEs, records written by the module; also TestLabEndpointCounted), then
# with the library counting them (WRITE WITH IMMEDIATE).
set -euo pipefail
lab_gotest rvma -test.v -test.run 'TestLabAssumptions|TestLabEngine$|TestLabEndpoint|TestLabExamples|TestLabLostControl|TestLabStripe|TestLabNotice|TestLabFlush' -test.timeout 150s -rvma.counting=module
lab_gotest rvma -test.v -test.run 'TestLabEndpoint|TestLabExamples|TestLabLostControl|TestLabStripe|TestLabNotice|TestLabFlush' -test.timeout 150s -rvma.counting=library
