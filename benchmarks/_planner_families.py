"""Model families benchmarks/planner.py measures beyond the ones the planner was built on
(issue 40): Hugging Face Llama with grouped-query attention and SDPA, Qwen2 with tied embeddings,
a ViT whose blocks sit in an ``nn.Sequential``, a ResNet with BatchNorm, a dense mixture of
experts and LoRA on a frozen Llama.

Each builder takes the batch size and returns ``(module, one process's batch, wrapped class
names)``. The ViT and the ResNet are written in plain torch in the shape torchvision gives them
(``torchvision.models.VisionTransformer`` and ``ResNet`` with ``BasicBlock``; torchvision is not a
dependency), at sizes that train in seconds on CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _planner_models import CausalLM, tokens
from torch import nn

import fullshard

Built = tuple[nn.Module, Any, tuple[str, ...]]


class Classifier(fullshard.Module):
    """An image classifier (``net``) trained with cross-entropy and AdamW."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(self.net(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=False)


def _images(batch: int, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=generator)
    return images, torch.randint(0, classes, (batch,), generator=generator)


# ------------------------------------------------------------------------ ViT (torchvision's shape)
class MLPBlock(nn.Sequential):
    """torchvision's ``MLPBlock``: Linear, GELU, Dropout, Linear, Dropout."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__(
            nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, width), nn.Dropout(0.0)
        )


class EncoderBlock(nn.Module):
    """torchvision's ``EncoderBlock``: pre-norm self-attention and MLP, both residual."""

    def __init__(self, heads: int, width: int, hidden: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = MLPBlock(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """torchvision's ``Encoder``: a position embedding and the blocks in an ``nn.Sequential``."""

    def __init__(self, tokens: int, layers: int, heads: int, width: int, hidden: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, tokens, width).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*(EncoderBlock(heads, width, hidden) for _ in range(layers)))
        self.ln = nn.LayerNorm(width, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))  # type: ignore[no-any-return]


class VisionTransformer(nn.Module):
    """torchvision's ``VisionTransformer``: patches by a strided conv, a class token, the encoder, a head."""

    def __init__(
        self,
        image: int = 64,
        patch: int = 8,
        layers: int = 4,
        heads: int = 4,
        width: int = 128,
        classes: int = 100,
    ) -> None:
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder((image // patch) ** 2 + 1, layers, heads, width, 4 * width)
        self.heads = nn.Sequential(nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])  # type: ignore[no-any-return]


def vit(batch: int) -> Built:
    """A ViT on 64x64 images (65 tokens of width 128, 4 blocks)."""
    return Classifier(VisionTransformer()), _images(batch, 64, 100), ("EncoderBlock",)


# ------------------------------------------------------------------ ResNet (torchvision's shape)
class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock``: two 3x3 convs with BatchNorm, a downsampling shortcut when needed."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)  # type: ignore[no-any-return]


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with ``BasicBlock`` (``layers=(2, 2, 2, 2)``: ResNet-18's layout)."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), width: int = 16, classes: int = 100) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, inplanes = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            stage = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
            stage += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]


def resnet(batch: int) -> Built:
    """ResNet-18's layout at width 16 on 64x64 images, wrapped by ``BasicBlock``."""
    return Classifier(ResNet()), _images(batch, 64, 100), ("BasicBlock",)


# ------------------------------------------------------------------------- dense mixture of experts
class DenseMoEBlock(nn.Module):
    """A pre-norm residual block whose MLP is a softmax-gated mix of every expert (no routing)."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, experts, bias=False)
        self.up = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(experts))
        self.down = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        weights = self.gate(y).softmax(-1)
        mixed = sum(
            weights[..., i : i + 1] * down(F.silu(up(y)))
            for i, (up, down) in enumerate(zip(self.up, self.down, strict=True))
        )
        return x + mixed  # type: ignore[return-value]


class DenseMoE(fullshard.Module):
    """An embedding, dense mixture-of-experts blocks and a head, trained as a language model."""

    def __init__(self, vocab: int = 1024, width: int = 128, depth: int = 4, experts: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(DenseMoEBlock(width, experts) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x = self.embed(batch[:, :-1])
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=False)


def moe_dense(batch: int) -> Built:
    """Four dense mixture-of-experts blocks (4 experts each), 128 tokens."""
    return DenseMoE(), tokens(batch, 128, 1024), ("DenseMoEBlock",)


# ------------------------------------------------------------------------ Hugging Face families
def _llama_gqa() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=4096,
        use_cache=False,
    )


def llama_gqa_sdpa(batch: int) -> Built:
    """A Hugging Face Llama with grouped-query attention (2 key/value heads for 4) and SDPA attention."""
    return CausalLM(_llama_gqa(), attention="sdpa"), tokens(batch, 128, 1024), ("LlamaDecoderLayer",)


def qwen2_tied(batch: int) -> Built:
    """A Hugging Face Qwen2 with tied input and output embeddings (as Qwen2-0.5B), SDPA attention."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        use_cache=False,
    )
    return CausalLM(config, attention="sdpa"), tokens(batch, 128, 1024), ("Qwen2DecoderLayer",)


class LoRACausalLM(CausalLM):
    """A Hugging Face causal LM with its weights frozen and LoRA adapters (peft) on the attention projections."""

    def configure_model(self) -> None:
        if self.model is None:
            from peft import LoraConfig, get_peft_model

            super().configure_model()
            lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
            self.model = get_peft_model(self.model, lora)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-4, foreach=False)


def llama_lora(batch: int) -> Built:
    """LoRA (rank 8 on q_proj and v_proj) on a frozen tiny Llama with grouped-query attention, SDPA."""
    return LoRACausalLM(_llama_gqa(), attention="sdpa"), tokens(batch, 128, 1024), ("LlamaDecoderLayer",)
