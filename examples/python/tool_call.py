#!/usr/bin/env python3
"""One tool call's budget steps against a Tally cluster, from Python over plain gRPC.

Stubs come from api/proto (run generate.sh first; see README.md). The program

1. authorizes a hold (one call slot, $100.00 of exposure), captures it before "paying",
   and reconciles it with the realized cost, $42.50;
2. reads the account back with ListUsages;
3. shows the lost-acknowledgement pattern (docs/spec.md §5, §9, §10):
   - a command whose reply is "lost" is sent again with the same event_id: the cluster
     answers the original decision (`replayed`), and applies nothing twice;
   - every reply says whether its outcome is known, in the `tally-outcome` metadata entry;
   - the same event_id with a different command is a conflict, not a replay;
   - ResolveEvent turns "was it applied?" into a final answer: the original decision for an
     applied command; for one that never arrived, a tombstone ("not applied", for ever), so
     a late copy of it can never apply.

Every answer is checked: on anything unexpected it prints why and exits 1.
Amounts are integer units of the grant's currency; here a unit is a US cent.
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen"))

try:
    import grpc
    from tally.v1 import budget_pb2, budget_pb2_grpc, common_pb2
except ImportError as error:  # pragma: no cover - a setup problem, said plainly
    sys.exit(
        f"tool_call.py: {error}\n"
        "install requirements.txt and run generate.sh first (see examples/python/README.md)"
    )

# The grant: 50 calls, $100.00 a call, $1,000.00 in all. The first allowed command pins these
# limits on the account; every later command must name the same ones.
LIMITS = common_pb2.GrantLimits(
    max_invocations=50,
    max_cost_per_invocation_units=10_000,
    max_total_cost_units=100_000,
    currency="USD",
)
EXPOSURE = 10_000  # what the call may cost at most: $100.00
REALIZED = 4_250  # what it turns out to cost: $42.50
TIMEOUT_S = 5.0
OUTCOME_KEY = "tally-outcome"
DETAILS_KEY = "grpc-status-details-bin"


class Surprise(Exception):
    """The cluster answered something this example does not expect."""


def check(condition, message):
    if not condition:
        raise Surprise(message)


def cents(units):
    return f"${units // 100}.{units % 100:02d}"


def tally_outcome(call):
    """The `tally-outcome` entry of a finished call, and where it came: an error reply carries
    it in its trailers; an OK reply (a decision) carries it in its response metadata, which
    gRPC sends as headers, so look in both."""
    for where, metadata in (
        ("trailers", call.trailing_metadata()),
        ("headers", call.initial_metadata()),
    ):
        for key, value in metadata or ():
            if key == OUTCOME_KEY:
                return value, where
    return None, None


def error_detail(error):
    """The Tally ErrorDetail an error status carries (docs/spec.md §10)."""
    for key, value in error.trailing_metadata() or ():
        if key == DETAILS_KEY:
            return common_pb2.ErrorDetail.FromString(value)
    return None


def outcome_name(decision):
    return decision.outcome.WhichOneof("outcome")


def channel_to(endpoint, tls_dir, insecure):
    """Mutual TLS with the `kernel` certificate `tally-node dev` wrote (the role that may send
    budget commands); plaintext only for a cluster started with --insecure."""
    if insecure:
        return grpc.insecure_channel(endpoint)
    def read(name):
        path = os.path.join(tls_dir, name)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise SystemExit(f"no {path}: start `tally-node dev` (it writes certificates there) or pass --tls-dir")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read("kernel.key"),
        certificate_chain=read("kernel.pem"),
    )
    # Node certificates name `tally-node`, whatever address the node is reached at.
    return grpc.secure_channel(endpoint, credentials, options=[("grpc.ssl_target_name_override", "tally-node")])


class Example:
    def __init__(self, endpoint, tls_dir, insecure):
        self.channel = channel_to(endpoint, tls_dir, insecure)
        self.budget = budget_pb2_grpc.BudgetStub(self.channel)
        run_id = f"{int(time.time() * 1000)}-{random.getrandbits(32):08x}"
        # A family is the root capability of a delegation chain (the unit the cluster
        # linearizes); the account is (capability, grant index). Fresh ids per run, so the
        # example can run again against the same cluster.
        self.family = f"py-family-{run_id}"
        self.capability = f"py-cap-{run_id}"
        self.run_id = run_id
        # Every command names a deadline after which it must not apply; a retry of a lost
        # command resends the whole command, deadline included.
        self.not_after_ms = int(time.time() * 1000) + 60_000

    def header(self, event_id):
        return common_pb2.CommandHeader(
            family_id=self.family,
            capability_id=self.capability,
            grant_index=0,
            event_id=event_id,
            not_after_ms=self.not_after_ms,
        )

    def hold_id(self, request):
        # docs/spec.md §9: ids are pure functions of the request, so every retry names the
        # same hold and the same events.
        return f"budget-hold:{request}-{self.run_id}:{self.capability}:0"

    def authorize_request(self, hold):
        return common_pb2.AuthorizeHoldRequest(
            header=self.header(f"{hold}:authorize"),
            hold_id=hold,
            requested_exposure_units=EXPOSURE,
            limits=LIMITS,
            hold_timeout_ms=60_000,
        )

    def send(self, rpc, request, step):
        """One command: returns its Decision, after printing the `tally-outcome` entry.

        A definite UNAVAILABLE (no leader yet: the command was not proposed) is retried with
        the same request. Anything else unexpected raises: a real client would also retry an
        indefinite failure (UNKNOWN, a timeout) with the same request, then ResolveEvent."""
        method = getattr(self.budget, rpc)
        for attempt in range(20):
            try:
                decision, call = method.with_call(request, timeout=TIMEOUT_S)
                break
            except grpc.RpcError as error:
                value, _ = tally_outcome(error)
                if error.code() != grpc.StatusCode.UNAVAILABLE or value != "definite" or attempt == 19:
                    raise
                print(f"   {rpc}: UNAVAILABLE, not proposed ({error.details()}); sending it again")
                time.sleep(0.25)
        value, where = tally_outcome(call)
        check(value == "definite", f"{step}: a decision must say tally-outcome: definite, got {value!r}")
        answer = outcome_name(decision)
        if answer == "resolved":
            answer += f" ({decision.outcome.resolved.WhichOneof('resolution')})"
        if decision.HasField("budget_commit_index"):
            answer += f", commit index {decision.budget_commit_index}"
        if decision.replayed:
            answer += ", replayed"
        print(f"   {rpc}: {answer}; tally-outcome: {value} (in the reply's {where})")
        return decision

    def send_expecting_error(self, rpc, request, step, code):
        """A command expected to be refused with `code`: returns its ErrorDetail."""
        try:
            decision = getattr(self.budget, rpc).with_call(request, timeout=TIMEOUT_S)[0]
        except grpc.RpcError as error:
            check(error.code() == code, f"{step}: expected {code}, got {error.code()}: {error.details()}")
            value, where = tally_outcome(error)
            detail = error_detail(error)
            check(detail is not None, f"{step}: the error carries no ErrorDetail")
            print(
                f"   {rpc}: {error.code().name} ({detail.reason}: {detail.message}); "
                f"tally-outcome: {value} (in the reply's {where})"
            )
            check(value == "definite", f"{step}: a refusal is definite, got tally-outcome {value!r}")
            return detail
        raise Surprise(f"{step}: expected {code}, got a decision: {decision}")

    def resolve(self, command, step):
        """ResolveEvent: the original decision if applied, else a tombstone (`not_applied`)."""
        decision = self.send("ResolveEvent", common_pb2.ResolveEventRequest(original=command), step)
        check(outcome_name(decision) == "resolved", f"{step}: expected resolved, got {decision}")
        return decision.outcome.resolved

    def usage(self):
        page = self.budget.ListUsages(
            budget_pb2.ListUsagesRequest(family_id=self.family), timeout=TIMEOUT_S
        )
        check(len(page.usages) == 1, f"expected one account in the family, got {len(page.usages)}")
        row = page.usages[0]
        check(row.key.capability_id == self.capability and row.key.grant_index == 0, f"another account: {row.key}")
        return row.account

    # ───────────────────────────── the steps ─────────────────────────────

    def tool_call(self):
        print(f"family {self.family}, capability {self.capability}, grant 0")
        hold = self.hold_id("req-1")
        print(f"1. one tool call, hold {hold}")

        authorized = self.send("AuthorizeHold", self.authorize_request(hold), "authorize")
        check(outcome_name(authorized) == "authorized", f"authorize: {authorized}")
        check(authorized.outcome.authorized.exposure_units == EXPOSURE, f"authorize: {authorized}")
        check(not authorized.replayed and authorized.HasField("budget_commit_index"), f"authorize: {authorized}")
        authorize_index = authorized.budget_commit_index

        # Capture before paying: of two identical concurrent evaluations exactly one owns the
        # capture (told apart by the random attempt id); only the owner may pay.
        attempt = f"attempt-{random.getrandbits(64):016x}"
        captured = self.send(
            "CaptureInvocation",
            common_pb2.CaptureInvocationRequest(
                header=self.header(f"{hold}:capture-invocation:{authorize_index}"),
                hold_id=hold,
                attempt_id=attempt,
            ),
            "capture",
        )
        check(outcome_name(captured) == "captured", f"capture: {captured}")
        check(captured.outcome.captured.attempt_id == attempt, f"capture: {captured}")
        print(f"   (captured by {attempt}: pay and run the tool; it cost {cents(REALIZED)})")

        # Reconcile: the whole remaining exposure, and what was really spent.
        reconciled = self.send(
            "ReconcileHold",
            common_pb2.ReconcileHoldRequest(
                header=self.header(f"{hold}:reconcile"),
                hold_id=hold,
                exposed_cost_units=EXPOSURE,
                realized_spend_units=REALIZED,
            ),
            "reconcile",
        )
        check(outcome_name(reconciled) == "reconciled", f"reconcile: {reconciled}")
        r = reconciled.outcome.reconciled
        check((r.realized_units, r.unspent_units) == (REALIZED, EXPOSURE - REALIZED), f"reconcile: {reconciled}")
        print(f"   reconciled: {cents(r.realized_units)} spent, {cents(r.unspent_units)} given back")

        account = self.usage()
        print(
            f"2. ListUsages: {account.invocation_count} call(s) ({account.reserved_invocations} reserved, "
            f"{account.captured_invocations} captured), {cents(account.total_cost_exposed_units)} exposed, "
            f"{cents(account.total_cost_realized_spend_units)} realized; limits pinned: "
            f"{account.limits.max_invocations} calls, {cents(account.limits.max_cost_per_invocation_units)} a call, "
            f"{cents(account.limits.max_total_cost_units)} in all, {account.limits.currency}"
        )
        check(account.limits == LIMITS, f"pinned limits differ: {account.limits}")
        check(
            (account.invocation_count, account.reserved_invocations, account.captured_invocations) == (1, 0, 1),
            f"expected one captured call: {account}",
        )
        check(
            (account.total_cost_exposed_units, account.total_cost_realized_spend_units) == (0, REALIZED),
            f"expected nothing exposed and {REALIZED} realized: {account}",
        )
        return hold

    def lost_acknowledgement(self, reconciled_hold):
        print("3. lost acknowledgements")
        hold = self.hold_id("req-2")
        request = self.authorize_request(hold)
        print(f"   a second call authorizes hold {hold}, and its reply is lost:")
        self.send("AuthorizeHold", request, "authorize (reply lost)")
        # Pretend the decision above never arrived (a timeout, a reset connection, a leader
        # that crashed after committing). The client cannot tell "applied" from "not
        # applied", so it sends the same command again: same event_id, same deadline.
        print("   ... no reply; retry the same command (same event_id):")
        retry = self.send("AuthorizeHold", request, "authorize retry")
        check(retry.replayed, f"the retry was applied again instead of replayed: {retry}")
        check(outcome_name(retry) == "authorized", f"authorize retry: {retry}")
        original = self.lookup(request.header.event_id)
        check(
            (retry.event_id, retry.outcome, retry.budget_commit_index, retry.log_id)
            == (original.event_id, original.outcome, original.budget_commit_index, original.log_id),
            f"the retry answered another decision: original {original}, retry {retry}",
        )
        print(f"   the same decision as the original (commit index {retry.budget_commit_index}), nothing applied twice")

        # The same event_id with a different command is a conflict, never a replay.
        changed = common_pb2.AuthorizeHoldRequest()
        changed.CopyFrom(request)
        changed.requested_exposure_units = EXPOSURE // 2
        print("   the same event_id with another amount:")
        detail = self.send_expecting_error("AuthorizeHold", changed, "conflicting retry", grpc.StatusCode.ALREADY_EXISTS)
        check(detail.reason == "event_identity", f"conflict reason: {detail}")
        print(f"   conflict: differing fields {list(detail.differing_fields)}")

        # ResolveEvent of an applied command answers its original decision.
        print("   ResolveEvent of the applied authorize:")
        resolved = self.resolve(common_pb2.Command(authorize_hold=request), "resolve applied")
        check(resolved.WhichOneof("resolution") == "applied", f"expected applied, got {resolved}")
        check(
            resolved.applied.budget_commit_index == original.budget_commit_index
            and resolved.applied.outcome == original.outcome,
            f"ResolveEvent answered another decision: {resolved.applied}",
        )
        print(f"   applied: the original {outcome_name(resolved.applied)} at commit index {resolved.applied.budget_commit_index}")

        # A command that never reached the cluster (say the request, not the reply, was
        # lost): ResolveEvent tombstones its event_id, a final "not applied".
        lost = self.authorize_request(self.hold_id("req-3"))
        print(f"   ResolveEvent of {lost.header.event_id}, which was never sent:")
        resolved = self.resolve(common_pb2.Command(authorize_hold=lost), "resolve never sent")
        check(resolved.WhichOneof("resolution") == "not_applied", f"expected not_applied, got {resolved}")
        print("   not applied: tombstoned, it never applied and never will")
        again = self.resolve(common_pb2.Command(authorize_hold=lost), "resolve again")
        check(again.WhichOneof("resolution") == "not_applied", f"ResolveEvent is idempotent: {again}")
        lookup = self.budget.GetEvent(
            budget_pb2.GetEventRequest(family_id=self.family, event_id=lost.header.event_id), timeout=TIMEOUT_S
        )
        check(lookup.WhichOneof("lookup") == "tombstoned", f"GetEvent: expected tombstoned, got {lookup}")
        print("   GetEvent: tombstoned")
        print("   a late copy of it arrives after all:")
        detail = self.send_expecting_error("AuthorizeHold", lost, "late copy", grpc.StatusCode.FAILED_PRECONDITION)
        check(detail.reason == "event_aborted", f"late copy: expected event_aborted, got {detail}")

        # Give the second call's hold back (its exact remaining exposure), so the family ends
        # with the first call only.
        reversed_ = self.send(
            "ReverseHold",
            common_pb2.ReverseHoldRequest(
                header=self.header(f"{hold}:authorize:rollback:{original.budget_commit_index}"),
                hold_id=hold,
                exposure_units=EXPOSURE,
            ),
            "reverse",
        )
        check(outcome_name(reversed_) == "reversed", f"reverse: {reversed_}")
        account = self.usage()
        check(
            (account.invocation_count, account.total_cost_exposed_units, account.total_cost_realized_spend_units)
            == (1, 0, REALIZED),
            f"after the retries: {account}",
        )
        print(
            f"4. usage after all retries: {account.invocation_count} call, "
            f"{cents(account.total_cost_exposed_units)} exposed, {cents(account.total_cost_realized_spend_units)} realized"
        )

    def lookup(self, event_id):
        """GetEvent: the decision an applied event got."""
        lookup = self.budget.GetEvent(
            budget_pb2.GetEventRequest(family_id=self.family, event_id=event_id), timeout=TIMEOUT_S
        )
        check(lookup.WhichOneof("lookup") == "applied", f"GetEvent {event_id}: {lookup}")
        return lookup.applied.decision


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="127.0.0.1:7401", help="a cluster node (host:port); followers forward writes")
    parser.add_argument("--tls-dir", default=os.environ.get("TALLY_TLS_DIR", "./tally-data/tls"), help="the cluster's CA and the kernel certificate")
    parser.add_argument("--insecure", action="store_true", help="plaintext, for a cluster started with --insecure")
    args = parser.parse_args()
    example = Example(args.endpoint, args.tls_dir, args.insecure)
    try:
        grpc.channel_ready_future(example.channel).result(timeout=TIMEOUT_S)
        hold = example.tool_call()
        example.lost_acknowledgement(hold)
    except Surprise as surprise:
        print(f"\ntool_call.py FAILED: {surprise}", file=sys.stderr)
        return 1
    except grpc.RpcError as error:
        print(f"\ntool_call.py FAILED: unexpected {error.code()}: {error.details()}", file=sys.stderr)
        return 1
    except grpc.FutureTimeoutError:
        print(f"\ntool_call.py FAILED: could not connect to {args.endpoint}", file=sys.stderr)
        return 1
    finally:
        example.channel.close()
    print("\ntool_call.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
