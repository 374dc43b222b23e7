'''
DeepSpeed's evaluation program (seed 003's): loads deepspeed_train_model.pth, prints the test
accuracy, predicts one random test image and writes it with its predicted and true labels to
prediction.png (the seed showed it with matplotlib; here PIL writes the file).

    python3 examples/ds_eval.py
'''
import argparse
import torch
import numpy as np
from PIL import Image, ImageDraw
from model_definition import load_data, CustomModel, CLASSES, transform
from torchvision import datasets

parser = argparse.ArgumentParser()
parser.add_argument("--weights", default='deepspeed_train_model.pth')
parser.add_argument("--png", default='prediction.png')
parser.add_argument("--index", type=int, default=None, help="the test image (default: random)")
args = parser.parse_args()

train_loader, test_loader = load_data()
test_data = datasets.FashionMNIST(root='./data', train=False, transform=transform)
model = CustomModel()
model.load_state_dict(torch.load(args.weights))

# Evaluation
model.eval()
correct = 0
total = 0
with torch.no_grad():  # no gradients (saves memory)
    for images, labels in test_loader:
        outputs = model(images)
        _, predicted = torch.max(outputs.data, 1)  # the most probable class
        total += labels.size(0)
        correct += (predicted == labels).sum().item()
print(f"test accuracy: {100 * correct / total:.2f}%")

# One random test image
index = args.index if args.index is not None else np.random.randint(0, 1000)
test_image, true_label = test_data[index]
with torch.no_grad():
    output = model(test_image.unsqueeze(0))
predicted_label = torch.argmax(output).item()
print(f"image {index}: predicted {predicted_label} ({CLASSES[predicted_label]}), "
      f"true {true_label} ({CLASSES[true_label]})")

# The image, 8x enlarged, with both labels under it
pixels = test_data.data[index].numpy()
picture = Image.fromarray(pixels).resize((224, 224), Image.NEAREST).convert("RGB")
canvas = Image.new("RGB", (224, 264), "white")
canvas.paste(picture, (0, 0))
draw = ImageDraw.Draw(canvas)
ok = predicted_label == true_label
draw.text((4, 228), f"predicted: {CLASSES[predicted_label]}", fill=(0, 128, 0) if ok else (200, 0, 0))
draw.text((4, 246), f"true: {CLASSES[true_label]}", fill=(0, 0, 0))
canvas.save(args.png)
print(f"wrote {args.png}")
