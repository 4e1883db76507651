#!/bin/bash
# lab: guests=2 timeout=420
# lab: gotest=./pkg/activeaccess
#
# pkg/activeaccess, the programming model, between two guests (guest 1 the
# target, guest 2 the source): active puts to intercepted
# pages reach the handler once each with their data and a reply each, and
# memory stays untouched; active puts and gets on logged pages; plain RMA
# with its own flush; Flush returns only after the handlers ran (every
# reply is there); two sources flood a small log with a slow handler and
# the module never refuses an access (credits); a third source is refused;
# the target process is killed while a source waits in Flush (the flush
# fails with ErrDisconnected, no hang); the target's link goes down while
# a source waits in Flush (its keep-alive probe fails the flush with
# ErrDisconnected within about a second); misuse errors on both sides; a
# source that ignores credits is refused with an error while every put
# that succeeded is handled. Each test runs in the transparent and the
# library-mediated mode (TestLabRogue: transparent only).
set -euo pipefail
lab_gotest activeaccess -test.v -test.run '^TestLab' -test.timeout 400s
