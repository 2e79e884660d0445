"""FedAvg (McMahan et al. 2017) and the two variants the papers compare against:
FedProx (Li et al. 2020: a proximal term on the client) and FedAvgM (Hsu et al. 2019: server momentum).

Round: the server sends the global parameters to a sample of clients; each trains locally and sends
its parameters back; the server averages them (by sample count or uniformly) and, for FedAvgM,
applies the average as a pseudo-gradient with momentum.

Differential privacy (``dp_enabled = true``, also for FedDF's clients): user-level DP as in
DP-FedAvg (McMahan et al. 2018), with the noise added at the client. After local training a client
takes its update, the difference between its trained weights and the weights it received (every
floating-point entry of the state dict), scales it to L2 norm <= ``dp_clip_norm`` and adds
N(0, (dp_noise_multiplier * dp_clip_norm)^2) to every entry; it returns the received weights plus that
noisy update. Neighbouring federations differ by one client's whole data (add/remove, an absent client
contributing a zero update), so each round is a Gaussian mechanism of that noise multiplier. Each client
accounts it on its own `ClientAccountant` at sample rate ``q = m / K`` (the m clients sampled per round
out of K; 1 when all take part), one step per round of the run: a client sampled in round r first
records the rounds since its last one, and `query.privacy` records the rounds after its last one at the
end. The amplification by ``q`` holds against whoever sees only the global models without knowing who
took part; the server, which picks the clients, is not such an observer, so ``fraction = 1`` gives the
bound that holds against it. Models with BatchNorm are refused under DP (their running statistics
would leave unclipped and un-noised). With DP on, clients leave their training loss out of their metrics;
their sample counts (the averaging weights), local step counts and, on evaluation rounds, the accuracy of
what they send on their own test share still travel un-noised. The noise comes
from each client's secret seed (`dp_noise_seed = "secret"`, the default; fresh for every release) or from
the run seed (`"run"`: reproducible, and regenerable by the server); see `ClientBudget`.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from fedistill import devices
from fedistill.algorithms.base import (
    ALL_TASKS,
    TEXT_TASKS,
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    StopRun,
    clone_state,
    register,
)
from fedistill.algorithms.classic.fedavg_options import FedAvgMOptions, FedAvgOptions, FedProxOptions
from fedistill.algorithms.classic.local_model import LocalModel
from fedistill.algorithms.shared.decision_threshold import ThresholdCounts
from fedistill.algorithms.shared.drop_worst import accuracy, drop_worst_weights, predict_logits
from fedistill.algorithms.shared.norm_statistics import NormStatistics
from fedistill.algorithms.shared.sampling import mean_metric, sample_clients, sampling_rate
from fedistill.algorithms.shared.training import (
    LocalTraining,
    evaluate_model,
    local_metric_names,
    local_metrics,
    new_model,
    task_of,
    test_metrics,
    train_local,
)
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, Reply, successful
from fedistill.federation.messages import Message, expect_arrays, state_specs
from fedistill.federation.plausibility import screen_parameters
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.privacy.accounting import DPConfig, PrivacyBudgetExceeded
from fedistill.privacy.budget import (
    PRIVACY_QUERY,
    ClientBudget,
    epsilon_summary,
    epsilons_of,
    privacy_request,
    refusal,
    refusal_reason,
    warn_if_delta_too_large,
)
from fedistill.privacy.sanitize import sanitize_sum
from fedistill.seeding import torch_generator


def has_batchnorm(model: torch.nn.Module) -> bool:
    """Whether `model` has a BatchNorm layer, whose running statistics DP cannot clip."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())


def dp_of(options: Any) -> DPConfig | None:
    """The DP settings of an options object that has them and enables them, else None."""
    dp = getattr(options, "dp", None)
    return dp if isinstance(dp, DPConfig) and dp.enabled else None


class FedAvgClient(ClientLogic, ThresholdCounts, NormStatistics):
    """Trains the received global model on private data and returns the trained parameters."""

    def __init__(self, ctx: ClientContext, model_name: str | None = None) -> None:
        self.ctx = ctx
        self.local = LocalModel(ctx.config, ctx.info, model_name)  # built per round: idle sites hold none
        self.training = LocalTraining.from_config(ctx.config, ctx.info)
        dp = dp_of(ctx.options)
        self.budget = ClientBudget(dp, ctx.client_id, ctx.config.seed) if dp is not None else None
        self.accounted_round = 0  # DP: the last round this client's accountant has recorded
        if self.budget is not None and has_batchnorm(self.model):
            raise ConfigError(
                f"dp_enabled = true clips and noises client updates, but model {type(self.model).__name__} "
                "has BatchNorm, whose running statistics would leave unclipped: set norm = 'group' or "
                "'none', or use a model without BatchNorm (mlp, lenet5)"
            )
        self.local.release()

    @property
    def model(self) -> torch.nn.Module:
        """This round's local model (`LocalModel`: built on use, released after `train`)."""
        return self.local.model

    @property
    def specs(self) -> dict:
        return self.local.specs

    @handles("train")
    def train(self, message: Message) -> Message:
        """Train the received global model on the private data and return its parameters; with DP the round
        is accounted first, and a refused round trains nothing. The model is released afterwards."""
        try:
            return self._train(message)
        finally:
            self.local.release()

    def _train(self, message: Message) -> Message:
        expect_arrays(message, "parameters", self.specs)
        round = int(message.scalar("config", "round"))
        dp_metrics: dict[str, float] = {}
        if self.budget is not None:  # the round's privacy first: a refused round trains nothing
            try:
                dp_metrics = self._spend(round, enforce=True)
            except PrivacyBudgetExceeded as exc:
                return refusal("train", exc, self.budget.epsilon())
        received = message.tensors("parameters")
        self.model.load_state_dict(received)
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = self.local_update(message, generator)
        metrics["num_samples"] = len(self.ctx.train)
        state = self.model.state_dict()
        if self.budget is not None:
            state = self._sanitize(received, state, round)
            metrics = {k: v for k, v in metrics.items() if k != "train_loss"} | dp_metrics
            self.model.load_state_dict(state)  # the local accuracy below is that of what is sent
        if message.scalar("config", "evaluate_local", False):
            task = self.training.task
            metrics |= local_metrics(
                task, evaluate_model(self.model, self.ctx.test, self.ctx.info, task=task)
            )
        return Message.build("train", arrays={"parameters": state}, scalars={"metrics": metrics})

    def local_update(self, message: Message, generator: torch.Generator) -> dict[str, float]:
        """One round's training of `self.model`, which holds the received weights; variants that change
        the local objective (FL-MRCM's alignment) override this and keep the rest of the round."""
        return train_local(
            self.model,
            self.ctx.train,
            self.ctx.info,
            self.training,
            generator,
            prox_mu=float(message.scalar("config", "prox_mu", 0.0)),
        )

    # --- differential privacy (module docstring) ---------------------------------------------------
    def _spend(self, round: int, *, enforce: bool) -> dict[str, float]:
        """Record the rounds since the last recorded one (sample rate m / K); refuse past the target. A
        release (`enforce`) records at least one step: a round the server asks for again is a new release."""
        assert self.budget is not None
        config = self.ctx.config
        rate = sampling_rate(config.fraction, config.clients)
        noise = self.budget.noise_multiplier(rate, config.rounds)
        steps = max(1 if enforce else 0, round - self.accounted_round)
        epsilon = self.budget.spend(noise, rate, steps, enforce=enforce)
        self.accounted_round = max(self.accounted_round, round)
        return {"epsilon": epsilon, "noise_multiplier": noise}

    def _sanitize(
        self, received: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], round: int
    ) -> dict[str, torch.Tensor]:
        """received + clip(trained - received) + noise, over every floating-point entry at once."""
        assert self.budget is not None and self.budget.noise is not None
        names = [k for k, v in trained.items() if v.is_floating_point()]
        update = torch.cat([(trained[k] - received[k].to(trained[k].dtype)).flatten() for k in names])
        noise = self.budget.noise_generator("dp-update", round)
        update = sanitize_sum(update[None], self.budget.config.clip_norm, self.budget.noise, noise)
        out, start = dict(trained), 0
        for k in names:
            size = trained[k].numel()
            out[k] = received[k] + update[start : start + size].view_as(trained[k])
            start += size
        return out

    @handles(PRIVACY_QUERY)
    def privacy(self, message: Message) -> Message:
        """The end of a run: record the rounds after this client's last one, report epsilon."""
        if self.budget is None:
            raise FederationError(f"client {self.ctx.client_id} runs without differential privacy")
        metrics = self._spend(int(message.scalar("config", "round")), enforce=False)
        return Message.build(PRIVACY_QUERY, scalars={"metrics": metrics})

    def state_dict(self) -> dict[str, Any]:
        if self.budget is None:
            return {}
        return {"dp": self.budget.state_dict(), "accounted_round": self.accounted_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.budget is None or "dp" not in state:
            super().load_state_dict(state)
            return
        self.budget.load_state_dict(state["dp"])
        self.accounted_round = int(state["accounted_round"])


class PrivacyReport:
    """The server side of client-level DP: stop on a refusal, track and report epsilons."""

    def __init__(self, options: Any, sample_rate: float, clients: int) -> None:
        self.dp = dp_of(options)
        self.sample_rate = sample_rate  # m / K, stated in the final metrics
        if self.dp is not None:  # user-level DP: the individuals protected are the K clients
            warn_if_delta_too_large(self.dp.delta, clients, f"the federation's {clients} clients")
        self.epsilons: dict[int, float] = {}
        self.rounds_done = 0

    def check(self, sent: dict[int, Reply], round: int) -> None:
        """Note the reported epsilons; end the run (StopRun) if any client refused its round."""
        self.epsilons.update(epsilons_of(sent))
        reason = refusal_reason(sent, f"round {round}")
        if reason is not None:
            raise StopRun(reason, self.metrics())

    def metrics(self) -> dict[str, float]:
        """The epsilons reported so far, summarised; empty without DP."""
        return epsilon_summary(self.epsilons, self.dp.delta) if self.dp is not None else {}

    def final(self, fleet: Fleet, timeout: float | None) -> dict[str, float]:
        """Every client's epsilon through the last completed round (`query.privacy`)."""
        if self.dp is None:
            return {}
        expect = ReplySpec(metrics=("epsilon",))  # checked like every other reply: a number, finite
        replies = fleet.broadcast(privacy_request(self.rounds_done), timeout=timeout, expect=expect)
        self.epsilons.update(epsilons_of(replies))
        return self.metrics() | {"dp_sample_rate": self.sample_rate, "dp_rounds": self.rounds_done}

    def state_dict(self) -> dict[str, Any]:
        """The reported epsilons and the rounds done, for a resumed run."""
        return {"epsilons": {str(k): v for k, v in self.epsilons.items()}, "rounds_done": self.rounds_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""
        self.epsilons = {int(k): float(v) for k, v in state.get("epsilons", {}).items()}
        self.rounds_done = int(state.get("rounds_done", 0))


class FedAvgServer(ServerLogic):
    """Sends the global model to the round's clients and averages what they return (FedAvg, FedProx,
    FedAvgM)."""

    #: Further metrics the clients may report, averaged (uniformly) over the replies that carry them.
    reply_metrics: tuple[str, ...] = ()

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: FedAvgOptions = ctx.options
        self.model = new_model(ctx.config, ctx.info)
        self.specs = state_specs(self.model.state_dict())
        self.momentum: dict[str, torch.Tensor] = {}
        self.last_local: dict[str, float] = {}
        rate = sampling_rate(ctx.config.fraction, ctx.num_clients)
        self.privacy = PrivacyReport(self.options, rate, ctx.num_clients)
        self.task = task_of(ctx.config, ctx.info)
        if self.options.drop_worst and (ctx.validation is None or len(ctx.validation) == 0):
            self.options.check_run(ctx.config)  # the run checks both first; a server built in Python too
            raise ConfigError(f"{self.options.section}.drop_worst needs the server's validation split")
        self.options.check_task(ctx.config, self.task, ctx.info)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config = self.ctx.config
        chosen = self.participants(fleet, round)
        evaluate_local = round % config.eval_every == 0 or round == config.rounds
        request = Message.build(
            "train",
            arrays={"parameters": self.model.state_dict()},
            scalars={
                "config": {"round": round, "prox_mu": self.options.mu, "evaluate_local": evaluate_local}
            },
        )
        local_name, local_count = local_metric_names(self.task)
        expect = ReplySpec(
            {"parameters": self.specs},
            TRAIN_METRICS + ((local_name, local_count) if evaluate_local else ()),
            refusable=True,  # a client at its privacy budget refuses; `privacy.check` stops the run
        )
        requests = self.requests(fleet, round, request, chosen)
        sent = fleet.send(requests, timeout=config.timeout or None, expect=expect)
        self.privacy.check(sent, round)
        if self.options.plausibility_checks:
            sent = screen_parameters(fleet, sent)
        replies = successful(sent, minimum=min(config.min_clients, len(chosen)), what="trained parameters")
        states = [reply.tensors("parameters") for reply in replies.values()]
        counts = [float(reply.scalar("metrics", "num_samples")) for reply in replies.values()]
        kept = self._drop_worst(states) if self.options.drop_worst else list(range(len(states)))
        weights = [counts[i] if self.options.weighting == "samples" else 1.0 for i in kept]
        self._apply(self.options.combine([states[i] for i in kept], weights))
        metrics = {"train_loss": mean_metric(replies, "train_loss", counts), "clients": len(replies)}
        metrics |= {name: mean_metric(replies, name) for name in self.reply_metrics}
        if self.options.drop_worst:
            metrics["dropped"] = len(states) - len(kept)
        if evaluate_local:
            local_counts = [float(r.scalar("metrics", local_count)) for r in replies.values()]
            local = [float(r.scalar("metrics", local_name)) for r in replies.values()]
            metrics[local_name] = float(np.average(local, weights=local_counts))
            self.last_local = {local_name: metrics[local_name]}
        self.privacy.rounds_done = round
        return metrics | self.privacy.metrics()

    def participants(self, fleet: Fleet, round: int) -> list[int]:
        """The clients that train this round: a seeded sample of `fraction` of them."""
        config = self.ctx.config
        return sample_clients(fleet.clients, config.fraction, config.seed, round)

    def requests(self, fleet: Fleet, round: int, request: Message, chosen: list[int]) -> dict[int, Message]:
        """What each chosen client is sent: the same training request (variants add to some of them)."""
        return dict.fromkeys(chosen, request)

    def _drop_worst(self, states: list[dict[str, torch.Tensor]]) -> list[int]:
        """Indices of the received models that FedDF's drop-worst rule keeps (see drop_worst.py)."""
        validation = self.ctx.validation
        assert validation is not None
        scratch = copy.deepcopy(self.model)
        accuracies = []
        for state in states:
            scratch.load_state_dict(state)
            accuracies.append(accuracy(predict_logits(scratch, validation, self.ctx.info), validation.y))
        weights = drop_worst_weights(accuracies, self.ctx.info.num_classes)
        return [i for i, w in enumerate(weights) if w > 0]

    def _apply(self, average: dict[str, torch.Tensor]) -> None:
        """Plain replacement, or FedAvgM: v = beta * v + (avg - w); w = w + server_lr * v."""
        beta, lr = self.options.server_momentum, self.options.server_lr
        if beta == 0 and lr == 1.0:
            self.model.load_state_dict(average)
            return
        current = self.model.state_dict()
        new = {}
        for name, value in average.items():
            if not value.is_floating_point() or name not in dict(self.model.named_parameters()):
                new[name] = value  # buffers (BatchNorm statistics) are simply averaged
                continue
            delta = value - current[name]
            velocity = beta * self.momentum[name] + delta if name in self.momentum else delta
            self.momentum[name] = velocity
            new[name] = current[name] + lr * velocity
        self.model.load_state_dict(new)

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        return test_metrics(self.ctx.evaluate(self.model)) | self.last_local

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        return dict(last) | self.privacy.final(fleet, self.ctx.config.timeout or None)

    def models(self) -> dict[str, torch.nn.Module]:
        return {"global": self.model}

    def state_dict(self) -> dict:
        return {
            "model": clone_state(self.model),
            "momentum": dict(self.momentum),
            "last_local": self.last_local,
            "privacy": self.privacy.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        # a checkpoint reads back on the CPU: the velocity meets the model's parameters on the run's device
        self.momentum = {name: devices.on_device(v) for name, v in state.get("momentum", {}).items()}
        self.last_local = dict(state.get("last_local", {}))
        self.privacy.load_state_dict(state.get("privacy", {}))


register(
    Algorithm(
        "fedavg",
        "FedAvg: average locally trained models",
        FedAvgClient,
        FedAvgServer,
        FedAvgOptions,
        tasks=(*ALL_TASKS, *TEXT_TASKS),
    )
)
register(
    Algorithm(
        "fedprox",
        "FedProx: FedAvg with a proximal term (mu)",
        FedAvgClient,
        FedAvgServer,
        FedProxOptions,
        tasks=(*ALL_TASKS, *TEXT_TASKS),
    )
)
register(
    Algorithm(
        "fedavgm",
        "FedAvgM: FedAvg with server momentum",
        FedAvgClient,
        FedAvgServer,
        FedAvgMOptions,
        tasks=(*ALL_TASKS, *TEXT_TASKS),
    )
)
