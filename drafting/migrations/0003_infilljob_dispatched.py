from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("drafting", "0002_apitoken")]

    operations = [
        migrations.AddField(
            model_name="infilljob",
            name="dispatched",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
