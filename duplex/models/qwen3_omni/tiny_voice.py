"""Hand-set output layers that make the tiny checkpoint's code2wav speak an audible tone.

A random-init code2wav outputs ~1e-6 (inaudible), so scenarios, which judge the agent's audio by
its loudness, could not run on the tiny pipeline. Here everything after code2wav's transformer
is set by hand so that the waveform is 400 Hz + 800 Hz at about -18 dBFS, with a level that follows
the transformer's output. The code-dependent front (code embeddings, the transformer) stays
random, so different codes still give different audio, and every layer stays causal, so
streamed chunks still equal one full decode.

How the tone is built: the transformer output (50 Hz after the 2x2 upsampling, kept exact) gives
a level per 480-sample step (decoder[0]: ``1 + LEVEL_GAIN * channel 0``). Each decoder block's
transposed convolution (stride r) spreads every input sample over r output samples; its weights
carry a (sin, cos) channel pair per tone frequency and rotate it by the phase those r samples
advance, so after the four blocks the pair holds ``level * sin/cos(2 pi f t)`` at 24 kHz. Only
the causal half of each kernel is used, the snake activations and the residual units are made
exact identities, and the last convolution adds the two sines.
"""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 24000
TONES_HZ = (400.0, 800.0)
TONE_AMPLITUDE = 0.126  # per tone: two equal sines of amplitude a have RMS a, 0.126 = -18 dBFS
LEVEL_GAIN = 0.25  # level = 1 + 0.25 * (a unit-RMS transformer channel): follows the codes, stays > 0
_SNAKE_OFF = -100.0  # snake adds sin^2(x * exp(alpha)) / exp(beta): exp(-100) makes that exactly 0


def set_voice(code2wav) -> None:
    """Overwrite code2wav's upsampling and decoder weights in place (see the module docstring)."""
    with torch.no_grad():
        for transpose, convnext in code2wav.upsample:
            _identity_transpose(transpose.conv)
            convnext.gamma.zero_()  # the block's residual branch off: input passes through exactly
        _level(code2wav.decoder[0].conv)
        step = int(math.prod(code2wav.config.upsample_rates))  # output samples per decoder input sample
        # Each level step restarts the tones at phase 0: seamless only if it holds whole periods.
        assert all(step * hz % SAMPLE_RATE == 0 for hz in TONES_HZ), (step, TONES_HZ)
        for block in code2wav.decoder[1:-2]:
            rate = block.block[1].conv.stride[0]
            step //= rate
            _snake_off(block.block[0])
            _rotate(block.block[1].conv, rate, step, first=block is code2wav.decoder[1])
            for unit in block.block[2:]:
                _zeroed(unit.conv2.conv)  # residual unit: x + 0
        _snake_off(code2wav.decoder[-2])
        out = code2wav.decoder[-1].conv
        _zeroed(out)
        last = out.kernel_size[0] - 1  # the causal conv's current-sample tap
        for tone in range(len(TONES_HZ)):
            out.weight[0, 2 * tone, last] = TONE_AMPLITUDE


def _zeroed(conv: torch.nn.Conv1d | torch.nn.ConvTranspose1d) -> torch.Tensor:
    """Zero the convolution's weight and bias; returns the bias (every code2wav conv has one)."""
    assert conv.bias is not None
    conv.weight.zero_()
    conv.bias.zero_()
    return conv.bias


def _identity_transpose(conv: torch.nn.ConvTranspose1d) -> None:
    # Kernel == stride here, so every output sample copies its own input sample: a causal hold.
    _zeroed(conv)
    for channel in range(conv.in_channels):
        conv.weight[channel, channel, :] = 1.0


def _level(conv: torch.nn.Conv1d) -> None:
    bias = _zeroed(conv)
    conv.weight[0, 0, conv.kernel_size[0] - 1] = LEVEL_GAIN
    bias[0] = 1.0


def _snake_off(snake) -> None:
    snake.alpha.fill_(_SNAKE_OFF)
    snake.beta.zero_()


def _rotate(conv: torch.nn.ConvTranspose1d, rate: int, step: int, *, first: bool) -> None:
    """Output sample j of each input sample's r (at ``step`` samples of 24 kHz apart) gets the
    input's (sin, cos) pair rotated by the phase the tone advances in j * step samples.

    The first block's input is the level alone (a tone at phase 0: sin 0, cos 1), on channel 0.
    The causal trim keeps kernel taps r..2r-1 for the current input; taps 0..r-1 would reach the
    next one (look-ahead), so they stay 0.
    """
    _zeroed(conv)
    for tone, hz in enumerate(TONES_HZ):
        sin_in, cos_in = (0, 0) if first else (2 * tone, 2 * tone + 1)
        sin_out, cos_out = 2 * tone, 2 * tone + 1
        for j in range(rate):
            phase = 2 * math.pi * hz * j * step / SAMPLE_RATE
            tap = rate + j
            # sin(a + p) = sin a cos p + cos a sin p;  cos(a + p) = cos a cos p - sin a sin p
            conv.weight[cos_in, sin_out, tap] += math.sin(phase)
            conv.weight[cos_in, cos_out, tap] += math.cos(phase)
            if not first:
                conv.weight[sin_in, sin_out, tap] += math.cos(phase)
                conv.weight[sin_in, cos_out, tap] -= math.sin(phase)
