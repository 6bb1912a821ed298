#!/usr/bin/env python3
"""charge.py - an `idem run` handler that charges each order once.

    idem run --key order_id --output results.ndjson \
        --exec 'python3 charge.py' orders.ndjson

idem starts it once and writes one envelope per new message on its
standard input,

    {"key":"ord-1","token":1764680000000000,"attempt":1,"message":{...}}

and reads one answer per envelope, in order, on its standard output:

    {"ok":true,...}                    done: the line is the cached result
    {"error":"...","retryable":true}   try again later, with a new token
    {"error":"..."}                    failed for good (cached too)

Each answer is flushed at once: idem sends many envelopes before it reads
the first answer. The charge is a line appended to ledger.ndjson, standing
for the payment service. After a crash of idem between a charge and its
commit, the same key comes back with a higher attempt and token: a real
service would refuse a key it has charged (idempotent by key) or a token
lower than one it has seen (fenced); here the ledger records both.
"""
import json
import sys


def charge(key, token, order):
    with open("ledger.ndjson", "a") as ledger:
        ledger.write(json.dumps({"key": key, "token": token,
                                 "amount": order["amount"]}) + "\n")


for line in sys.stdin:
    envelope = json.loads(line)
    order = envelope["message"]
    amount = order.get("amount")
    if not isinstance(amount, (int, float)) or amount <= 0:
        answer = {"error": "amount must be a positive number"}
    else:
        charge(envelope["key"], envelope["token"], order)
        answer = {"ok": True, "charged": amount}
    print(json.dumps(answer, separators=(",", ":")), flush=True)
