"""The shadow stage of the sidecar: sample finished production trials, plan their replays, send
them to the replay targets, answer the replayed agents' tool calls through the sandbox, and record
everything in the ledger (:mod:`relyscope.store.shadow`).

One thread runs :meth:`ShadowStage.tick` every ``shadow_interval_s``: it decides the trials that
ended in ``[now − shadow_lookback_s, now − shadow_quiet_s]`` and have no decision yet (cost
follows the window, not the history), plans the sampled ones, and dispatches scheduled replays
``shadow_concurrency`` at a time. A replay POSTs a ``relyscope.replay/v1`` request
(:mod:`relyscope.instrumentation.replay`) with a fresh trace id in ``traceparent``; its spans come
back over OTLP and are scored like any run (run kind ``shadow`` or ``canary``). The tool proxy
sessions live in memory for the duration of a replay, keyed by a random token in the proxy URL
(the capability the agent is handed); the API routes of
:mod:`relyscope.exporter.shadow_api` call :meth:`ShadowStage.proxy_answer`.

Errors: store errors are logged and retried next tick (``StoreUnavailable``); a target that is
down, answers garbage or never answers marks the replay ``error`` / ``timeout`` with the reason —
production data is never touched. Thread-safety: the public methods are safe from any thread.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from relyscope.config import Settings
from relyscope.model import Trial
from relyscope.shadow.plan import ReplaySpec, plan_replays
from relyscope.shadow.proxy import ProxyAnswer, SandboxSession, recorded_calls, replayable
from relyscope.shadow.sampler import SampleDecision, Sampler
from relyscope.store import Store, StoreUnavailable
from relyscope.store.shadow import ShadowLedger

__all__ = ["ShadowStage"]

log = logging.getLogger("relyscope.shadow")
#: the most production runs a manual plan (``--last`` / ``--tasks``) reads to find replayable ones
_MAX_CANDIDATES = 20_000  # whole trials (steps too) are loaded to judge them
#: skipped runs a plan's reply lists (``skipped_total`` counts them all)
_SKIPPED_SHOWN = 20
logging.getLogger("httpx").setLevel(logging.WARNING)  # not one INFO line per replay request


class ShadowStage:
    """See the module docstring. ``proxy_base_url``: where replayed agents reach the API (the tool
    proxy is ``{proxy_base_url}/shadow/v1/sessions/{token}/tool-calls``, a random token per attempt).
    ``state_path``: a JSON file that keeps the operator's pause across restarts (the sidecar puts
    it beside the spool, ``<spool dir>.shadow.json``); None keeps it in memory only."""

    def __init__(self, settings: Settings, store: Store, policy: Any = None, *, proxy_base_url: str,
                 state_path: str | None = None):
        from relyscope.shadow.faults import FaultInjector

        s = settings
        self.settings = s
        self.store = store
        self.ledger = ShadowLedger(store)
        self.policy = policy
        self.proxy_base_url = (s.shadow_proxy_url or proxy_base_url).rstrip("/")
        # which sidecar runs a replay (several may share one store): stable across restarts of
        # this one (host name — the pod's in Kubernetes — and its state file or proxy URL)
        import socket

        self.owner = f"{socket.gethostname()}:{state_path or self.proxy_base_url}"
        self.sampler = Sampler(s.shadow_rate, s.shadow_cap_per_hour, s.shadow_quiet_s)
        from relyscope.shadow.faults import FAULT_MIX

        self.injector = FaultInjector(s.shadow_p_fault, s.shadow_fault_mix or FAULT_MIX,
                                      timeout_s=s.shadow_fault_timeout_s,
                                      retry_after_s=s.shadow_fault_retry_after_s)  # tools: globs, per session
        self.state_path = state_path
        self.last_error: str | None = None
        self.save_error: str | None = None
        # only JSON true pauses: a hand-edited "false" (a string) must not (bool("false") is True)
        self.paused = s.shadow_paused or self._load_state().get("paused") is True
        self.sessions: dict[str, SandboxSession] = {}
        # sessions of attempts that ended (token → session, trace id), newest last, bounded: a call
        # that arrives after its replay ended is a sandbox miss of that replay (_flush_late)
        self._ended: collections.OrderedDict[str, tuple[SandboxSession, str]] = collections.OrderedDict()
        self._late: set[str] = set()
        self.running: set[str] = set()
        self.counts: dict[str, collections.Counter] = {
            "decisions": collections.Counter(), "replays": collections.Counter(), "scheduled": collections.Counter(),
            "proxy": collections.Counter(), "faults": collections.Counter(),
            "side_effects_recorded": collections.Counter(), "rewriter": collections.Counter()}
        self.rewriter_cost_usd: float | None = None
        self._rewriter_obj = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=s.shadow_concurrency, thread_name_prefix="relyscope-replay")
        self._hour: tuple[int, dict[str, int]] | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling / dispatch thread."""
        self._thread = threading.Thread(target=self._loop, name="relyscope-shadow", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; replays in flight are left ``scheduled`` for the next start. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def pause(self) -> bool:
        """Stop sampling and dispatching (replays in flight finish); the pause outlives a restart
        (``state_path``). Returns whether it was written durably (False: in memory only, the
        reason in ``save_error``, also ``last_error`` until the next tick)."""
        self.paused = True
        return self._save_state()

    def resume(self) -> bool:
        """Undo :meth:`pause` (also a pause kept from before a restart). Returns as pause does."""
        self.paused = False
        self._wake.set()
        return self._save_state()

    def _load_state(self) -> dict:
        if not self.state_path:
            return {}
        try:
            with open(self.state_path, encoding="utf-8") as f:
                state = json.load(f)
            return state if isinstance(state, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:  # unreadable: start as configured, say why
            self.last_error = f"shadow state {self.state_path} unreadable ({e}); using RELYSCOPE_SHADOW_PAUSED"
            log.warning(self.last_error)
            return {}

    def _save_state(self) -> bool:
        self.save_error = None
        if not self.state_path:
            self.save_error = "no state file is configured: the pause is kept in memory only"
            return False
        tmp = f"{self.state_path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"paused": self.paused, "at": time.time()}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
            return True
        except OSError as e:
            self.save_error = self.last_error = f"shadow state not saved to {self.state_path}: {e}"
            log.warning(self.last_error)
            return False

    def kick(self) -> None:
        """Run a tick now instead of at the next interval."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except StoreUnavailable as e:
                self.last_error = str(e)
                log.warning("shadow tick: store unavailable: %s", e)
            except Exception as e:  # noqa: BLE001 - a stage boundary: log, keep running
                self.last_error = str(e)
                log.exception("shadow tick failed")
            self._wake.wait(self.settings.shadow_interval_s)
            self._wake.clear()

    # ---- one cycle ------------------------------------------------------------------------------
    def tick(self, now_ns: int | None = None) -> int:
        """Sample, plan and dispatch once (nothing while paused). Returns replays dispatched."""
        self._flush_late()
        if self.paused or not self.settings.shadow_targets:
            return 0
        self.sample(now_ns)
        done = 0
        while not self._stop.is_set() and not self.paused:
            n = self.dispatch(max_n=4 * self.settings.shadow_concurrency)
            if not n:
                break
            done += n
        return done

    def _sampled_this_hour(self, now_s: float) -> dict[str, int]:
        hour = int(now_s // 3600)
        if self._hour is None or self._hour[0] != hour:
            self._hour = (hour, self.ledger.sampled_since(hour * 3600.0))
        return self._hour[1]

    def sample(self, now_ns: int | None = None) -> list[SampleDecision]:
        """Decide every eligible production trial of the look-back window that has no decision
        yet; plan the sampled ones. Returns the decisions made."""
        now_ns = now_ns or time.time_ns()
        s = self.settings
        ids = self.ledger.candidate_trial_ids(now_ns - int(s.shadow_lookback_s * 1e9),
                                              now_ns - int(s.shadow_quiet_s * 1e9))
        new = sorted(set(ids) - self.ledger.decided(ids))
        if not new:
            return []
        trials = [t for t in self.store.load_trials(trial_ids=new) if self.sampler.eligible(t, now_ns)]
        hour = self._sampled_this_hour(now_ns / 1e9)
        counts = dict(hour)  # taken from the hour's cap only once the decisions are stored
        decisions, sampled = [], []
        for t in sorted(trials, key=lambda t: t.end_ns):
            d = self.sampler.decide(t, counts)
            decisions.append(d)
            if d.decision == "sampled":
                counts[t.agent_name] = counts.get(t.agent_name, 0) + 1
                sampled.append(t)
        self._schedule(sampled)
        self.ledger.record_decisions(decisions)
        hour.update(counts)
        self.counts["decisions"].update(d.decision for d in decisions)
        return decisions

    def plan_now(self, *, trial_ids: list[str] | None = None, last: int | None = None,
                 tasks: int | None = None, again: bool = False) -> dict[str, Any]:
        """Plan replays of the given production trials (or the ``last`` most recent replayable
        ones, or the most recent replayable run of each of the ``tasks`` (agent, task) pairs run
        most recently) regardless of the sampling rate (decision ``manual``). Replays already in the ledger
        are not planned again (same ids: idempotent) and are counted in ``existing``; ``again``
        plans a new experiment instead — new replay and experiment ids salted with its start time,
        which supersede the earlier replays of these trials in every score and gate. Returns
        ``{"replay_ids", "trials", "skipped": [{trial_id, reason}] (the first 20; ``skipped_total``), "notes", "existing",
        "again", "scheduled_at"}`` (``scheduled_at``: Unix s of this plan, the ``gate --since``
        that judges only it). Raises ValueError when no target is configured or a trial id is
        unknown."""
        if not self.settings.shadow_targets:
            raise ValueError("no replay target is configured: set RELYSCOPE_SHADOW_TARGETS "
                             "(agent version → URL of its replay endpoint)")
        if trial_ids:
            trials = self.store.load_trials(trial_ids=trial_ids)
            missing = sorted(set(trial_ids) - {t.trial_id for t in trials})
            if missing:
                raise ValueError(f"unknown trial ids: {missing[:5]}")
        n = max(1, int(tasks or last or 1))
        candidates = trials if trial_ids else self._recent_candidates(n, by_task=bool(tasks))
        chosen, skipped, decisions = [], [], []
        seen_tasks: set[tuple[str, str]] = set()
        for t in candidates:
            if tasks and (t.agent_name, t.task_id) in seen_tasks:
                continue  # this task has its run (the most recent replayable one)
            ok, why = _manual_replayable(t)
            if not ok:
                skipped.append({"trial_id": t.trial_id, "reason": why})
                continue
            if not trial_ids and len(chosen) >= n:
                break
            chosen.append(t)
            seen_tasks.add((t.agent_name, t.task_id))
            decisions.append(SampleDecision(t.trial_id, t.agent_name, t.agent_version, t.task_id, "manual",
                                            "requested over the API"))
        now = time.time()
        specs, notes, existing = self._schedule(chosen, salt=f"again@{time.time_ns()}" if again else "", now=now)
        if again and specs:
            notes += self._cancel_superseded(specs)
        self.ledger.record_decisions(decisions)
        self.counts["decisions"].update(d.decision for d in decisions)
        self._wake.set()
        return {"replay_ids": [sp.replay_id for sp in specs], "trials": [t.trial_id for t in chosen],
                "skipped": skipped[:_SKIPPED_SHOWN], "skipped_total": len(skipped), "notes": notes,
                "existing": existing, "again": again, "scheduled_at": now}

    def _recent_candidates(self, n: int, *, by_task: bool) -> list[Trial]:
        """Production trials, newest first, enough for ``n`` replayable ones (of ``n`` distinct
        tasks when ``by_task``) if the store has them: read in pages widening ×10 from 4n (the
        newest runs may not be replayable — no recorded input —, and a pick that looked at 4n
        only found nothing), at most :data:`_MAX_CANDIDATES`. A run stamped up to a day ahead of
        this clock is a candidate too."""
        limit = n * 4
        while True:
            ids = self.ledger.candidate_trial_ids(0, time.time_ns() + 86_400 * 10**9, limit=limit, newest_first=True,
                                                  per_task=max(4, limit // n) if by_task else None)
            page = self.store.load_trials(trial_ids=ids) if ids else []
            page.sort(key=lambda t: (-t.end_ns, t.trial_id))
            ok = [t for t in page if _manual_replayable(t)[0]]
            found = len({(t.agent_name, t.task_id) for t in ok}) if by_task else len(ok)
            if found >= n or len(ids) < limit or limit >= _MAX_CANDIDATES:
                return page
            limit = min(limit * 10, _MAX_CANDIDATES)

    def _cancel_superseded(self, specs: list[ReplaySpec]) -> list[str]:
        """Cancel the replays of earlier experiments on the trials of ``specs`` that have not
        started yet: the new experiment supersedes them in every score and gate, so running them
        would only spend the targets' capacity — and, dispatched oldest first, hold the new
        experiment back. Replays already running finish (their results stay visible). Returns notes."""
        new = {(sp.shadow_of, sp.target_version): sp.experiment for sp in specs}
        rows = [r for r in self.ledger.replays(status="scheduled", shadow_of={so for so, _ in new}, limit=1_000_000)
                if (r["shadow_of"], r["target_version"]) in new and r["experiment"] != new[(r["shadow_of"], r["target_version"])]]
        if not rows:
            return []
        self.ledger.write_replays([{**r, "status": "cancelled", "finished_at": time.time(),
                                    "error": f"superseded by experiment {new[(r['shadow_of'], r['target_version'])]} "
                                             "(planned again) before it started"} for r in rows])
        self.counts["replays"]["cancelled"] += len(rows)
        return [f"{len(rows)} replays of earlier experiments on these trials had not started: cancelled"]

    def _rewrite(self, text: str, seed: int, strength: str) -> list[str]:
        from relyscope.shadow.rewriters import prompt_variants

        rw = self._rewriter
        try:
            out = prompt_variants(text, j=self.settings.shadow_j, seed=seed, strength=strength, rewriter=rw)
        except Exception as e:  # noqa: BLE001 - an LLM rewriter over budget or down: fall back, counted
            from relyscope.shadow.rewriters import RuleRewriter

            self.counts["rewriter"]["fallback"] += 1
            log.warning("prompt rewriter failed (%s); using the built-in rule rewriter", e)
            out = prompt_variants(text, j=self.settings.shadow_j, seed=seed, strength=strength, rewriter=RuleRewriter())
        usage = getattr(rw, "usage", None)
        if usage is not None:  # the LLM rewriter: calls and cost of this cycle (None = unknown)
            u = usage() if callable(usage) else usage
            self.counts["rewriter"]["calls"] = u.calls
            self.counts["rewriter"]["failed_calls"] = u.failed_calls
            self.rewriter_cost_usd = u.cost_usd
        return out

    @property
    def _rewriter(self):
        if self._rewriter_obj is None:
            self._rewriter_obj = self._make_rewriter()
        return self._rewriter_obj

    def _make_rewriter(self):
        from relyscope.shadow.rewriters import LLMRewriter, RuleRewriter

        s = self.settings
        if not s.rewriter_url:
            return RuleRewriter()
        key = s.rewriter_api_key.get_secret_value() if s.rewriter_api_key else None
        return LLMRewriter(s.rewriter_url, s.rewriter_model, key, max_calls_per_cycle=s.rewriter_max_per_cycle,
                           price_per_1k_input_tokens=s.rewriter_price_per_1k_input_tokens,
                           price_per_1k_output_tokens=s.rewriter_price_per_1k_output_tokens)

    def _schedule(self, trials: list[Trial], *, salt: str = "",
                  now: float | None = None) -> tuple[list[ReplaySpec], list[str], int]:
        """Plan ``trials`` (ids salted with ``salt``) and write the replays the ledger does not
        have yet as ``scheduled`` at ``now``. Returns (specs written, notes, replays that existed)."""
        s = self.settings
        if "prompt" in s.shadow_families and s.shadow_j:
            rw = self._rewriter
            if hasattr(rw, "new_cycle"):
                rw.new_cycle()
        specs: list[ReplaySpec] = []
        notes: list[str] = []
        for t in trials:
            sp, nt = plan_replays(t, sorted(s.shadow_targets), k=s.shadow_k, j=s.shadow_j,
                                  families=s.shadow_families, env_strength=s.shadow_env_strength,
                                  prompt_strength=s.shadow_prompt_strength, run_kind=s.shadow_run_kind,
                                  rewrite=self._rewrite, salt=salt)
            specs += sp
            notes += [f"{t.trial_id}: {n}" for n in nt]
        # a trial planned again (a second `shadow start`, a restart) keeps its replays: same ids
        known = self.ledger.existing_replay_ids([sp.replay_id for sp in specs]) if specs else set()
        existing = sum(sp.replay_id in known for sp in specs)
        specs = [sp for sp in specs if sp.replay_id not in known]
        now = time.time() if now is None else now
        self.ledger.write_replays([{**_spec_row(sp), "status": "scheduled", "scheduled_at": now} for sp in specs])
        self.counts["scheduled"].update(sp.family for sp in specs)
        return specs, notes, existing

    def dispatch(self, max_n: int = 8) -> int:
        """Run up to ``max_n`` scheduled replays (``shadow_concurrency`` at a time), record each
        result as its replay ends. Returns how many ran. Raises StoreUnavailable when results
        could not be written (those replays stay ``running`` and are run again)."""
        # "running" rows of this sidecar not running here were cut off by a stop or a crash: run
        # them again (their new trace id replaces the old one, so a cut-off attempt's spans are
        # never scored). Those of another sidecar sharing the store are its business — until they
        # are older than any attempt can last (that sidecar died with them).
        now = time.time()
        stale_s = self.settings.shadow_replay_timeout_s + _STALE_MARGIN_S
        cut = [r for r in self.ledger.replays(status="running", limit=100_000, oldest_first=True)
               if r["replay_id"] not in self.running
               and (_runner(r) in (None, self.owner) or (r.get("updated_at") or 0) < now - stale_s)]
        rows = sorted(cut + self.ledger.replays(status="scheduled", limit=max_n, oldest_first=True),
                      key=lambda r: (r["scheduled_at"] or 0, r["family"], r["idx"]))[:max_n]
        if not rows:
            return 0
        mine: dict[str, str] = {}
        for r in rows:  # trace ids are known (and stored) before any replay starts
            r["trace_id"], r["status"], r["error"] = os.urandom(16).hex(), "running", f"{_RUNNING_ON}{self.owner}"
            mine[r["replay_id"]] = r["trace_id"]
        self.ledger.write_replays(rows)
        # several sidecars may take the same row at once: the last write owns it, the others let go
        now_rows = {r["replay_id"]: r for r in self.ledger.replays(replay_ids=list(mine), limit=len(mine))}
        rows = [r for r in rows if now_rows.get(r["replay_id"], {}).get("trace_id") == mine[r["replay_id"]]]
        if not rows:
            return 0
        prods = {t.trial_id: t for t in self.store.load_trials(trial_ids={r["shadow_of"] for r in rows})}
        with self._lock:
            self.running.update(r["replay_id"] for r in rows)
        # each result is written as soon as its replay ends: a crash or a stop loses (and re-runs)
        # only the replays still running, not every finished one of the batch
        unwritten: list[dict] = []
        error: StoreUnavailable | None = None
        try:
            futures = [self._pool.submit(self._run_one_safe, r, prods.get(r["shadow_of"])) for r in rows]
            for f in as_completed(futures):
                res = f.result()
                if error is None:
                    try:
                        self.ledger.write_replays([res])
                    except StoreUnavailable as e:  # keep going: the others' results are retried below
                        error = e
                        unwritten.append(res)
                else:
                    unwritten.append(res)
                self.counts["replays"][res["status"]] += 1
            if unwritten:
                self.ledger.write_replays(unwritten)
        finally:  # only when every replay of the batch ended (none is dispatched twice at once)
            with self._lock:
                self.running.difference_update(r["replay_id"] for r in rows)
        return len(rows)

    def _run_one_safe(self, row: dict, prod: Trial | None) -> dict:
        """:meth:`_run_one`, with any failure of ours recorded as the replay's ``error`` (a stage
        boundary: one broken replay never blocks the batch or loops forever as ``running``)."""
        try:
            return self._run_one(row, prod)
        except Exception as e:  # noqa: BLE001
            log.exception("replay %s failed inside the sidecar", row["replay_id"])
            return {**row, "status": "error", "error": f"sidecar error: {type(e).__name__}: {e}"[:500],
                    "finished_at": time.time()}

    def _run_one(self, row: dict, prod: Trial | None) -> dict:
        from relyscope.instrumentation.replay import ReplayRequest, ReplayTask
        from relyscope.shadow.envperturb import perturb_result

        s = self.settings
        rid = row["replay_id"]
        out = dict(row)
        out["finished_at"] = None
        url = s.shadow_targets.get(row["target_version"])
        if prod is None or url is None:
            out.update(status="cancelled", error="production trial gone" if prod is None
                       else f"no replay target for version {row['target_version']!r} any more",
                       finished_at=time.time())
            return out
        session = SandboxSession(
            rid, recorded_calls(prod), family=row["family"], seed=int(row["seed"]), strength=row["strength"],
            injector=self.injector, live_tools=s.shadow_live_tools, fault_tools=s.shadow_fault_tools,
            policy_side_effects={k: getattr(v, "value", v) for k, v in getattr(self.policy, "side_effects", {}).items()},
            perturb=perturb_result)
        trace_id, span_id = row["trace_id"], os.urandom(8).hex()
        # the proxy URL's capability: random per attempt (replay ids derive from trial ids, which
        # anyone reading traces knows, and the proxy route takes no bearer token)
        token = secrets.token_hex(16)
        req = ReplayRequest(
            replay_id=rid, run_kind=row["run_kind"], shadow_of=row["shadow_of"],
            task=ReplayTask(task_id=row["task_id"], input=row["input"], agent=row["agent"]),
            family=row["family"], strength=row["strength"], seed=int(row["seed"]),
            traceparent=f"00-{trace_id}-{span_id}-01",
            tool_proxy_url=f"{self.proxy_base_url}/shadow/v1/sessions/{token}/tool-calls",
            deadline_s=s.shadow_replay_timeout_s, target_version=row["target_version"])
        with self._lock:
            self.sessions[token] = session
        status, error = "completed", ""
        try:
            code, content, over = post_within(url, json.dumps(req.to_json()).encode(), s.shadow_replay_timeout_s)
            try:
                reply = None if over else json.loads(content)
            except (ValueError, RecursionError):
                reply = None
            if code != 200 or not isinstance(reply, dict) or reply.get("replay_id") != rid:
                shown = content[:200].decode("utf-8", "replace")
                size = f" (over {REPLY_MAX_BYTES} bytes)" if over else ""
                status, error = "error", f"target {url} answered HTTP {code}{size}, not a replay reply: {shown!r}"
            elif reply.get("status") == "failed":
                status, error = "failed", str(reply.get("error") or "")[:500]
        except DeadlineExceeded:
            status, error = "timeout", f"no reply from {url} within {s.shadow_replay_timeout_s:g} s"
        except TargetUnreachable as e:
            status, error = "error", f"target {url} unreachable: {e}"
        finally:
            with self._lock:
                self.sessions.pop(token, None)
                self._ended[token] = (session, trace_id)
                while len(self._ended) > _ENDED_KEPT:
                    self._ended.popitem(last=False)
        summ = session.summary()
        if summ["misses"] and status in ("completed", "failed"):
            status = "sandbox_miss"
        for c in session.calls:
            self.counts["proxy"][c["outcome"] if c["outcome"] in ("live", "sandbox_miss") else c["match"]] += 1
            if c.get("fault"):
                self.counts["faults"][c["fault"]] += 1
            if c["side_effecting"]:
                self.counts["side_effects_recorded"][c["side_effect"] or "unknown"] += 1
        out.update(status=status, error=error, trace_id=trace_id, calls=session.log_json(),
                   n_calls=summ["calls"], n_exact=summ["exact"], n_position=summ["position"],
                   n_live=summ["live"], n_miss=summ["misses"], n_faults=summ["faults"],
                   n_side_effects=summ["side_effects"], finished_at=time.time())
        return out

    # ---- the proxy ------------------------------------------------------------------------------
    def proxy_answer(self, token: str, call: dict) -> ProxyAnswer | None:
        """The sandbox's answer to one tool call of the running replay attempt whose proxy token
        this is; None for an unknown or finished one. Raises ValueError for a malformed call."""
        with self._lock:
            session = self.sessions.get(token)
        if session is None:
            self._late_miss(token, "called after its replay had ended", call.get("name"))
            return None
        return session.answer(call)

    def proxy_refuse(self, token: str, reason: str, name: Any = None) -> dict[str, Any] | None:
        """Log a tool call the proxy could not read as a sandbox miss of the running replay
        attempt whose token this is (:meth:`SandboxSession.refuse`); its envelope, or None for an
        unknown token."""
        with self._lock:
            session = self.sessions.get(token)
        if session is None:
            self._late_miss(token, reason, name)
            return None
        return session.refuse(reason, name)

    def _late_miss(self, token: str, reason: str, name: Any) -> None:
        """A call on the token of an attempt that already ended (the target answered before its
        agent was done — an endpoint that runs the agent in the background —, or the deadline
        passed): the agent gets a sandbox miss, so its replay is one; logged in the ended
        session and written to the ledger by :meth:`_flush_late`."""
        with self._lock:
            ended = self._ended.get(token)
        if ended is None:
            return
        ended[0].refuse(reason, name)  # logged before it is flagged: a flush then sees it
        with self._lock:
            self._late.add(token)

    def _flush_late(self) -> None:
        """Rewrite the ledger rows of ended attempts that got calls afterwards: their call log and
        counts, and ``sandbox_miss`` for a replay that was ``completed`` / ``failed`` (the gate's
        sandbox-miss rate reads the ledger). Rows not written yet wait for the next tick; rows of
        a later attempt (a re-run) are left alone."""
        from relyscope.store.shadow import FINISHED

        with self._lock:
            late = {t: self._ended[t] for t in self._late if t in self._ended}
            self._late.clear()
        if not late:
            return
        by_rid = {sess.replay_id: (t, sess, tid) for t, (sess, tid) in late.items()}
        rows = self.ledger.replays(replay_ids=list(by_rid), with_calls=True, limit=len(by_rid))
        out, retry = [], set(late)
        for r in rows:
            tok, sess, tid = by_rid[r["replay_id"]]
            if r["trace_id"] != tid:  # a later attempt owns the row now
                retry.discard(tok)
                continue
            if r["status"] not in FINISHED:
                continue
            retry.discard(tok)
            summ = sess.summary()
            status = "sandbox_miss" if summ["misses"] and r["status"] in ("completed", "failed") else r["status"]
            out.append({**r, "status": status, "calls": sess.log_json(), "n_calls": summ["calls"],
                        "n_exact": summ["exact"], "n_position": summ["position"], "n_live": summ["live"],
                        "n_miss": summ["misses"], "n_faults": summ["faults"], "n_side_effects": summ["side_effects"]})
        retry &= {by_rid[r["replay_id"]][0] for r in rows}  # a row gone from the ledger: nothing to do
        try:
            self.ledger.write_replays(out)
        except StoreUnavailable:
            retry |= {by_rid[r["replay_id"]][0] for r in out}
            raise
        finally:
            with self._lock:
                self._late |= retry


#: a running row of another sidecar this much older than the replay deadline is taken over
_STALE_MARGIN_S = 30.0
#: the ``error`` text of a running row: which sidecar runs it
_RUNNING_ON = "running on "


def _manual_replayable(t: Trial) -> tuple[bool, str]:
    """Whether a manual plan may replay ``t``, and why not: :func:`replayable`, and only
    production runs (never a replay)."""
    if t.run_kind != "production" or t.shadow_of:
        return False, f"run kind {t.run_kind}: only production runs are replayed"
    return replayable(t)


def _runner(row: dict) -> str | None:
    """The sidecar running a ``running`` row (None: written before rows said so)."""
    e = row.get("error") or ""
    return e[len(_RUNNING_ON):] if e.startswith(_RUNNING_ON) else None


#: ended replay attempts whose late tool calls are still attributed to them
_ENDED_KEPT = 4096

#: the largest replay reply read (a reply is a few hundred bytes: replay id, status, trace id, error)
REPLY_MAX_BYTES = 1 << 20


class DeadlineExceeded(Exception):
    """No complete reply within the replay's deadline."""


class TargetUnreachable(Exception):
    """The replay target could not be reached or broke the connection / the HTTP protocol."""


class _Watchdog:
    """Remembers the sockets an httpx request opens (httpcore's ``trace`` extension reports each
    new connection's network stream) so that :meth:`cut` can shut them down from another thread:
    a blocked read returns at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks: list[Any] = []
        self.cut_done = False

    def trace(self, name: str, info: dict) -> None:
        if not name.endswith(("connect_tcp.complete", "connect_unix_socket.complete")):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            late = self.cut_done
        if late:
            _shutdown(sock)

    def cut(self) -> None:
        with self._lock:
            self.cut_done = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)


def _shutdown(sock) -> None:
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def post_within(url: str, body: bytes, deadline_s: float, *,
                max_bytes: int = REPLY_MAX_BYTES) -> tuple[int, bytes, bool]:
    """POST ``body`` (JSON) to ``url`` and read the reply, all within ``deadline_s`` seconds in
    total — httpx's timeouts are per read, so a target that trickles bytes (headers or body) would
    hold a replay, and the whole dispatch batch, forever; at the deadline a watchdog shuts the
    connection's socket down. Reads at most ``max_bytes`` of the body. Returns ``(HTTP status,
    body, over)``, ``over`` when the body was longer (then only its first ``max_bytes``). Raises
    :class:`DeadlineExceeded`, :class:`TargetUnreachable`."""
    import httpx

    dog = _Watchdog()
    timer = threading.Timer(deadline_s, dog.cut)
    timer.daemon = True
    try:
        with httpx.Client(timeout=deadline_s) as client:
            timer.start()
            # identity: a compressed reply could expand far past max_bytes within one chunk
            headers = {"content-type": "application/json", "accept-encoding": "identity"}
            with client.stream("POST", url, content=body, headers=headers,
                               extensions={"trace": dog.trace}) as resp:
                buf = bytearray()
                for chunk in resp.iter_bytes():
                    buf += chunk
                    if len(buf) > max_bytes:
                        return resp.status_code, bytes(buf[:max_bytes]), True
                if dog.cut_done:  # a body cut short by the watchdog is no reply
                    raise DeadlineExceeded()
                return resp.status_code, bytes(buf), False
    except httpx.TimeoutException:
        raise DeadlineExceeded() from None
    except httpx.HTTPError as e:
        if dog.cut_done:
            raise DeadlineExceeded() from None
        raise TargetUnreachable(str(e) or type(e).__name__) from None
    finally:
        timer.cancel()


def _spec_row(sp: ReplaySpec) -> dict:
    return {"replay_id": sp.replay_id, "experiment": sp.experiment, "shadow_of": sp.shadow_of,
            "task_id": sp.task_id, "agent": sp.agent, "prod_version": sp.prod_version,
            "target_version": sp.target_version, "run_kind": sp.run_kind, "family": sp.family,
            "strength": sp.strength, "seed": sp.seed, "idx": sp.index, "input": sp.input}
