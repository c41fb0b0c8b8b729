"""The smallest job spec the service tests submit: an MLP on the digits, one epoch, seeded."""

TINY = """\
name: tiny
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: 1
optimizer: {name: sgd, lr: 0.1}
device: cpu
seed: 3
"""
