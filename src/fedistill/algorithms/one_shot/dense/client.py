"""The site of DENSE and Co-Boosting: it trains its local model once, exactly as FedIOD's client trains
its teacher (same architecture rule, epochs, training stream and stage-1 cache entry), and uploads it
once. Afterwards it only scores the students the server sends on its own validation split.
"""

from __future__ import annotations

from fedistill.algorithms.base import ClientContext
from fedistill.algorithms.one_shot.dense.options import DenseOptions, teacher_of
from fedistill.algorithms.shared.stage1 import train_teacher
from fedistill.algorithms.shared.training import evaluate_model, new_model
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import Message, expect_arrays, state_specs


class OneShotClient(ClientLogic):
    """`train`: the local model's parameters (once); `evaluate.student`: validation metrics only."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: DenseOptions = ctx.options
        self.architecture = teacher_of(self.options, ctx.config, ctx.client_id)
        self.model = new_model(ctx.config, ctx.info, self.architecture)
        self.student = new_model(ctx.config, ctx.info, self.options.student or ctx.config.model)
        self.student_specs = state_specs(self.student.state_dict())

    @handles("train")
    def train(self, message: Message) -> Message:
        """Train this client's model once on its private data and send it with its validation accuracy."""
        metrics = train_teacher(self.model, self.ctx, self.architecture, self.options.teacher_epochs)
        metrics["num_samples"] = len(self.ctx.train)
        val = evaluate_model(self.model, self.ctx.val, self.ctx.info)
        metrics["teacher_val_accuracy"] = val["accuracy"] if val["count"] else -1.0
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return Message.build("train", arrays={"parameters": state}, scalars={"metrics": metrics})

    @handles("evaluate.student", read_only=True)
    def evaluate_student(self, message: Message) -> Message:
        """Score the received student on this client's validation split, for model selection."""
        expect_arrays(message, "parameters", self.student_specs)
        self.student.load_state_dict(message.tensors("parameters"))
        val = evaluate_model(self.student, self.ctx.val, self.ctx.info)
        metrics = {"val_accuracy": val["accuracy"] if val["count"] else 0.0, "val_count": val["count"]}
        return Message.build("evaluate.student", scalars={"metrics": metrics})
