"""The robustness layer `Context.send` runs every request through.

For one request, in order:

1. faults: clients unreachable this round are taken off the request; stragglers' training is
   cut to their partial step count (or their reply is lost);
2. the backend executes what is left; a backend may answer for fewer clients (a dead Flower
   node): its reply lists only those in `clients`;
3. adversaries replace their updates (model poisoning);
4. validation rejects bad rows (`clusterfl.robust.validate`);
5. privacy clips the surviving updates, adds the Gaussian noise and reports n_i = 1;
6. `send` returns how many clients the request reached and how many uploaded a reply (a
   rejected reply was still uploaded); `Context.send` books the communication from them.

The reply returned holds only the clients that answered and passed; its `clients` field
says who they are (`clusterfl.protocol`). Everything that happened is kept per round
(`end_round`) for the history, and the totals for the summary. Evaluation requests pass
untouched (measurement, not training traffic).

A Train/Gradient request with `coords` (CFL-GP's compressed features) gets replies of d̂
floats per client; steps 3–5 act on what was sent: the update at those coordinates is
poisoned, checked, clipped to S and noised (θ_start is narrowed the same way).

A `MixtureTrainRequest` (FedEM) is a training request whose update is the client's K models:
stragglers train fewer steps, and steps 3–5 act on the K·d-float update θ_{1..K,i} − θ_{1..K}
taken as one vector (one clip bound for what the client sends).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from clusterfl.engine.transfer import to_cpu
from clusterfl.errors import require
from clusterfl.protocol import (
    RE,
    Asks,
    Executor,
    Reply,
    Steps,
    StepsReply,
    join,
    positions_of,
    present,
    resolve_step,
    steps_reply,
    subset,
)
from clusterfl.robust.adversary import poison
from clusterfl.robust.config import (
    AdversaryConfig,
    FaultsConfig,
    PrivacyConfig,
    ValidationConfig,
)
from clusterfl.robust.divergence import RoundUpdates
from clusterfl.robust.faults import FaultPlan, RoundFaults, straggler_requests
from clusterfl.robust.privacy import clip_rows, epsilon, noise_rows
from clusterfl.robust.validate import Rejection, check_reply

_NOISE_STREAM, _ATTACK_STREAM = 31337, 27182
_TOTALS: dict[str, float] = {"rejected": 0, "dropped": 0, "straggled": 0, "clipped": 0,
                             "releases": 0, "unsampled": 0}
"""The run totals (checkpointed); `unsampled`: the noised releases that asked every client
(FL+HC's clustering round, FeSEM's warm-up), which the method's sampling does not amplify."""


class Guard:
    """Faults, adversaries, validation and privacy around one run's backend."""

    def __init__(
        self, n_clients: int, seed: int, train_sizes: np.ndarray,
        validation: ValidationConfig | None = None, faults: FaultsConfig | None = None,
        adversary: AdversaryConfig | None = None, privacy: PrivacyConfig | None = None,
        adversaries: np.ndarray | None = None, sampling_rate: float = 1.0,
    ) -> None:
        self.n_clients = n_clients
        self.sampling_rate = float(sampling_rate)
        self.seed = seed
        self.train_sizes = np.asarray(train_sizes)
        self.validation = validation or ValidationConfig()
        self.faults = FaultPlan(faults or FaultsConfig(), n_clients, seed)
        self.adversary = adversary or AdversaryConfig()
        self.privacy = privacy or PrivacyConfig()
        if self.privacy.noise_multiplier > 0:  # fail before the run, not when ε is reported
            require("privacy", "dp_accounting", load=False)
        self.adversaries = (np.zeros(0, np.int64) if adversaries is None
                            else np.asarray(adversaries, dtype=np.int64))
        self._bad = set(self.adversaries.tolist())
        self.t = 0
        self._now = RoundFaults(frozenset(), frozenset())
        self._request_no = 0
        self._events: dict[str, Any] = {}
        # run totals (checkpointed)
        self.totals: dict[str, float] = dict(_TOTALS)
        self.begin_round(0)

    # ------------------------------------------------------------------ rounds
    def begin_round(self, t: int) -> None:
        """Draw round t's failures and start its event log."""
        self.t = t
        self._now = self.faults.round(t) if self.faults.active else RoundFaults(
            frozenset(), frozenset())
        self._request_no = 0
        self._events = {"dropped": set(), "stragglers": set(), "rejected": [], "clipped": 0}
        self._updates = RoundUpdates()

    def round_updates(self) -> RoundUpdates:
        """The round's training / gradient replies: uploaded, kept, losses, rejections (for
        `clusterfl.robust.divergence.diagnose`)."""
        return self._updates

    def end_round(self) -> dict[str, Any]:
        """What happened in the round (JSON-able), for the history record."""
        e = self._events
        return {
            "dropped": sorted(e["dropped"]), "stragglers": sorted(e["stragglers"]),
            "rejected": [r.as_dict() for r in e["rejected"]], "clipped": e["clipped"],
        }

    # ------------------------------------------------------------------ one request
    def send(self, backend: Executor, request: Asks[RE]) -> tuple[RE, int, int]:
        """Run `request` through the layer.

        Returns the reply (the clients that answered and passed, in request order), the
        number of clients the request reached and the number that uploaded a reply (a
        rejected reply was still uploaded): `Context.send` books the cost from these.
        """
        self._request_no += 1
        requested = np.asarray(request.clients, dtype=np.int64)
        if request.kind == "evaluate":
            return join([backend.execute(request)], order=requested), len(requested), 0
        reachable = np.array([int(c) not in self._now.dropped for c in requested], dtype=bool)
        self._events["dropped"].update(int(c) for c in requested[~reachable])
        sent = request if reachable.all() else subset(request, np.flatnonzero(reachable))
        reply, uploaded = self._after(sent, self._execute(backend, sent),
                                      int((~reachable).sum()))
        return reply, int(reachable.sum()), uploaded

    def send_steps(self, backend: Executor,
                   request: Steps) -> tuple[StepsReply, list[tuple[int, int]]]:
        """Run a compound request through the layer: ONE execution (one message per client
        on Flower), then each step's reply through steps 3–5 exactly as if the step had been
        sent alone (`send`), in order, with the step as the client executed it
        (`protocol.resolve_step`): a client whose reply to a `Pick` source step was rejected
        is taken off the picked step, as it would not have been asked. Faults: a client
        unreachable this round answers no step. With a straggler this round and a training
        step, the steps are executed one by one with the per-request straggler rule (a
        simulated fault: on Flower that costs one message per step).

        Returns the reply and, per step, (clients reached, clients that uploaded), from which
        `Context.send` books each step as before."""
        requested = np.asarray(request.clients, dtype=np.int64)
        reachable = np.array([int(c) not in self._now.dropped for c in requested], dtype=bool)
        self._events["dropped"].update(int(c) for c in requested[~reachable])
        sent = request if reachable.all() else subset(request, np.flatnonzero(reachable))
        slow = self._now.stragglers & set(np.asarray(sent.clients).tolist())
        trains = any(s.trains for s in sent.steps)
        raw: StepsReply | None = None
        if not (slow and trains):
            raw = (sent.empty_reply() if not len(sent.clients)
                   else join([backend.execute(sent)], order=sent.clients))
        done: list[Reply] = []
        counts: list[tuple[int, int]] = []
        for j in range(len(sent.steps)):
            self._request_no += 1
            step = resolve_step(sent, j, done)
            got = self._execute(backend, step) if raw is None else present(
                raw.replies[j], step.clients)
            reply, uploaded = self._after(step, got, int((~reachable).sum()))
            done.append(reply)
            counts.append((len(step.clients), uploaded))
        return steps_reply(sent.clients, done), counts

    def _after(self, sent: Asks[RE], reply: RE, unreached: int = 0) -> tuple[RE, int]:
        """Steps 3–5 on the reply to `sent`: attacks, validation, privacy (and the round's
        events); returns the reply and how many clients uploaded one."""
        silent = set(np.asarray(sent.clients).tolist()) - set(reply.clients.tolist())
        self._events["dropped"].update(int(c) for c in silent)
        uploaded = len(reply.clients)
        update = sent.kind == "update"
        if update and uploaded and (self._bad or self.privacy.clip is not None):
            reply = to_cpu(reply)  # attacks and noise draw from CPU generators
        if update and uploaded:
            reply = self._attack(sent, reply)
            self._updates.uploaded += uploaded
            self._updates.losses.extend(_losses(reply, uploaded))
        if uploaded:
            keep, rejected = check_reply(sent, reply, self.validation)
            self._events["rejected"].extend(rejected)
            self.totals["rejected"] += len(rejected)
            if update:
                self._updates.rejected.update(r.reason for r in rejected)
            if not keep.all():
                reply = subset(reply, np.flatnonzero(keep)) if keep.any() else sent.empty_reply()
        if update:
            self._updates.kept += len(reply.clients)
        if self.privacy.clip is not None and update:
            reply = self._privatize(sent, reply, unreached)
        return reply, uploaded

    def _execute(self, backend: Executor, request: Asks[RE]) -> RE:
        """Execute (split for stragglers); the reply's rows follow `request.clients`."""
        clients = np.asarray(request.clients, dtype=np.int64)
        if len(clients) == 0:
            return request.empty_reply()
        slow = self._now.stragglers & set(clients.tolist())
        if not slow or not request.trains:
            return join([backend.execute(request)], order=clients)
        self._events["stragglers"].update(slow)
        work = self.faults.config.straggler_work
        if work == 0.0:
            on_time = np.array([int(c) not in slow for c in clients], dtype=bool)
            self._events["dropped"].update(slow)
            if not on_time.any():
                return request.empty_reply()
            return join([backend.execute(subset(request, np.flatnonzero(on_time)))],
                        order=clients)
        parts: list[RE] = [backend.execute(part) for part in straggler_requests(
            cast(Any, request), slow, work, self.train_sizes)]
        return join(parts, order=clients)

    # ------------------------------------------------------------------ attacks, privacy
    def _generator(self, stream: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(int(np.random.default_rng([self.seed, self.t, self._request_no, stream])
                          .integers(0, 2**63 - 1)))
        return g

    def _attack(self, request: Asks[RE], reply: RE) -> RE:
        """Model poisoning: each adversary's update (its `update_rows` less their base, the
        start model it was sent) replaced by the attack's (FedEM: the K·d-float update)."""
        kind = self.adversary.kind
        if kind in ("none", "label_flip") or not self._bad:
            return reply
        clients = reply.clients
        rows = np.flatnonzero([int(c) in self._bad for c in clients])
        if len(rows) == 0:
            return reply
        idx = torch.from_numpy(rows)
        gen = self._generator(_ATTACK_STREAM)
        flat = reply.update_rows()
        base = request.update_base(positions_of(request, clients[rows]))
        if flat.ndim != 2 or len(flat) != len(clients) or (
                base is not None and base.shape[1] != flat.shape[1]):
            return reply  # a malformed reply: validation rejects it
        delta = flat[idx] if base is None else flat[idx] - base
        bad = poison(kind, delta, self.adversary.strength(), gen)
        flat = flat.clone()
        flat[idx] = (bad if base is None else base + bad).to(flat.dtype)  # replies may be f32
        return reply.with_update_rows(flat)

    def _privatize(self, request: Asks[RE], reply: RE, unreached: int) -> RE:
        """Clip every update to S, add the noise, report n_i = 1. `unreached`: the clients
        of the request that this round's faults kept from it (they were asked too)."""
        p = self.privacy
        assert p.clip is not None
        clients = reply.clients
        if len(clients) == 0:
            return reply
        rows = positions_of(request, clients)
        gen = self._generator(_NOISE_STREAM)
        groups = request.update_groups(rows)
        base = request.update_base(rows)
        flat = reply.update_rows()
        delta, norms = clip_rows(flat if base is None else flat - base, p.clip)
        clipped = int((norms > p.clip).sum())
        self._events["clipped"] += clipped
        self.totals["clipped"] += clipped
        if p.noise_multiplier > 0:
            shape = (int(delta.shape[0]), int(delta.shape[1]))
            delta = delta + noise_rows(shape, groups, p.noise_multiplier, p.clip, p.noise, gen,
                                       delta.dtype)
            self.totals["releases"] += 1
            asked = len(np.unique(np.asarray(request.clients))) + unreached
            if self.sampling_rate < 1.0 and asked >= self.n_clients:
                self.totals["unsampled"] += 1  # every client asked: no subsampling to amplify
        return reply.with_update_rows(delta if base is None else base + delta,
                                      np.ones(len(clients), dtype=np.int64))

    # ------------------------------------------------------------------ reports, state
    def privacy_report(self) -> dict[str, Any] | None:
        """(ε, δ) of the run so far, with the numbers it was computed from."""
        p = self.privacy
        if p.clip is None:
            return None
        releases, unsampled = int(self.totals["releases"]), int(self.totals["unsampled"])
        q = self.sampling_rate
        eps = epsilon(p.noise_multiplier, q, releases, p.delta, unsampled) \
            if p.noise_multiplier > 0 else None
        return {"clip": p.clip, "noise_multiplier": p.noise_multiplier, "noise": p.noise,
                "delta": p.delta, "releases": releases, "unsampled_releases": unsampled,
                "sampling_rate": q, "epsilon": eps,
                "accountant": "dp_accounting RDP, Poisson-subsampled Gaussian"}

    def summary(self) -> dict[str, Any]:
        """Run totals for the summary (adversary ids are a diagnostic, never an input)."""
        return {
            "adversaries": self.adversaries.tolist(), "adversary_kind": self.adversary.kind,
            "rejected": int(self.totals["rejected"]), "dropped": int(self.totals["dropped"]),
            "straggled": int(self.totals["straggled"]), "clipped": int(self.totals["clipped"]),
            "privacy": self.privacy_report(),
        }

    def count_round(self, events: dict[str, Any]) -> None:
        """Add a finished round's dropouts and stragglers to the totals: each client once
        per round, as the history's `dropped` and `stragglers` list them (a straggler asked
        to train twice in a round, e.g. CFL-GP's clustering rounds, straggled once)."""
        self.totals["dropped"] += len(events["dropped"])
        self.totals["straggled"] += len(events["stragglers"])

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {**_TOTALS, **state["totals"]}  # a checkpoint of before `unsampled`


def _losses(reply: Reply, n: int) -> list[float]:
    """The training losses of an update reply's n rows ([] when it has not one per row)."""
    loss = np.asarray(getattr(reply, "loss", ()), dtype=np.float64).ravel()
    return loss.tolist() if len(loss) == n else []


__all__ = ["Guard", "Rejection"]
