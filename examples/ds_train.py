'''
DeepSpeed's training program (seed 003's ds_train.py) run by zinfinity: the only changes are
`import zinfinity as deepspeed` and the launcher line, and the CPU in place of .cuda().

    python3 examples/ds_train.py --epochs 5 --deepspeed --deepspeed_config examples/ds_config.json
    mpirun -np 2 python3 examples/ds_train.py --epochs 5 --deepspeed --deepspeed_config examples/ds_config.json

(with PYTHONPATH naming the built package, e.g. build/python). Writes ./ds_models/<epoch>
(a checkpoint per epoch) and deepspeed_train_model.pth (the weights, for ds_eval.py).
'''
import argparse
import torch
import zinfinity as deepspeed
from model_definition import load_data, CustomModel

if __name__ == '__main__':
    # The arguments given on the command line
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", help="local device id on current node", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    # The data (the loader's batch_size = train_batch_size in ds_config.json / ranks)
    train_loader, test_loader = load_data()
    # The model
    model = CustomModel()
    # Wrapped by the engine
    model_engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                                 model_parameters=model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()  # the loss of a classifier
    for i in range(args.epochs):
        for step, (inputs, labels) in enumerate(train_loader):
            # forward
            outputs = model_engine(inputs)
            loss = loss_fn(outputs, labels)
            # backward and the optimizer step, by the engine
            model_engine.backward(loss)
            model_engine.step()
            if step % 100 == 0:
                print(f"epoch {i} step {step} loss {loss.item():.4f}", flush=True)
        model_engine.save_checkpoint('./ds_models', i)
    # The weights
    torch.save(model_engine.module.state_dict(), 'deepspeed_train_model.pth')
