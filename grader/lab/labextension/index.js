// The course's Validate button (grader/lab_validate.py answers it).
//
// nbgrader 0.9.6's own button shows "Validation failed" when every test passes (its dialog
// reads a list its server never sends), labels any message "The following cell failed:", and
// cuts long lines. This button saves the notebook, asks the course's server extension to run
// it as grading will, and shows the summary first: how many exercises pass and their points,
// then each exercise still to do on a line of its own, then the note on hidden checks.
// The lab and the hub turn nbgrader's button off and this one on.

import { Dialog, showDialog, ToolbarButton } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

const ENDPOINT = 'counting-the-cost/validate';

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text; // never markup: messages hold what the student's code printed
  }
  return node;
}

function plural(points) {
  return `${points} point${points === 1 ? '' : 's'}`;
}

// The dialog's body for the course's answer (see grader/lab/validate.py, course_answer). A
// graded prediction whose number is in is neither passing nor open: only grading knows its
// answer, so it has a line of its own and its point is in no total.
function summaryNode(answer) {
  const body = element('div', 'ctc-validate');
  const exercises = answer.exercises || [];
  const open = exercises.filter(e => e.status !== 'passes' && e.status !== 'in');
  const passing = exercises.filter(e => e.status === 'passes' && !e.prediction);
  const graded = exercises.filter(e => e.status === 'in');
  if (answer.saved_numbers) {
    body.appendChild(element('p', 'ctc-validate-warning ctc-validate-numbers',
      answer.saved_numbers));
  }
  const headline = element('p', 'ctc-validate-headline', answer.headline);
  if (exercises.length && !open.length && !(answer.changed || []).length &&
      !answer.saved_numbers) {
    headline.classList.add('ctc-validate-all');
  }
  body.appendChild(headline);
  if ((answer.changed || []).length) {
    body.appendChild(element('p', 'ctc-validate-warning',
      "You changed cells that are locked; grading uses the course's version of each:"));
    const list = element('ul', 'ctc-validate-changed');
    for (const line of answer.changed) {
      list.appendChild(element('li', '', line));
    }
    body.appendChild(list);
  }
  if (open.length) {
    const list = element('ul', 'ctc-validate-open');
    for (const e of open) {
      const item = element('li', 'ctc-validate-exercise');
      const css = 'ctc-' + e.status.replace(' ', '-');
      item.appendChild(element('span', `ctc-validate-status ${css}`, e.status));
      item.appendChild(document.createTextNode(' '));
      item.appendChild(element('code', '', e.name));
      item.appendChild(document.createTextNode(
        ` (${plural(e.points)})` + (e.message ? `: ${e.message}` : '')));
      list.appendChild(item);
    }
    body.appendChild(list);
  }
  if (passing.length && open.length) {
    body.appendChild(element('p', 'ctc-validate-passing',
      'Passing: ' + passing.map(e => e.name).join(', ') + '.'));
  }
  for (const e of graded) {
    body.appendChild(element('p', 'ctc-validate-graded',
      `Graded when you hand in: ${e.name} (${plural(e.points)}). Your number is in; only ` +
      'grading knows the answer for your numbers.'));
  }
  body.appendChild(element('p', 'ctc-validate-note', answer.note));
  return body;
}

async function requestValidate(path) {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, ENDPOINT) + '?' +
    new URLSearchParams({ path }).toString();
  const response = await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
  if (!response.ok) {
    let message = response.statusText;
    try {
      message = (await response.json()).message || message;
    } catch (error) {
      // not JSON: the status text says enough
    }
    throw new Error(`${response.status} ${message}`);
  }
  return response.json();
}

function show(title, body) {
  return showDialog({ title, body, buttons: [Dialog.okButton()] });
}

class ValidateButton extends ToolbarButton {
  constructor(panel) {
    super({
      className: 'ctc-validate-button',
      label: 'Validate',
      tooltip: 'Run the notebook as grading will, and list what passes',
      onClick: () => void this.validate()
    });
    this.panel = panel;
    this.busy = false;
  }

  setLabel(text) {
    const label = this.node.querySelector('.jp-ToolbarButtonComponent-label');
    if (label) {
      label.textContent = text;
    }
  }

  async validate() {
    if (this.busy) {
      return;
    }
    this.busy = true;
    const context = this.panel.context;
    const name = context.path.split('/').pop();
    let title = 'Validate could not finish';
    let node;
    try {
      this.setLabel('Saving...');
      await context.save();
      this.setLabel('Validating...');
      const reply = await requestValidate(context.path);
      if (reply.success) {
        title = `Validate: ${name}`;
        node = summaryNode(reply.value);
      } else {
        node = element('p', 'ctc-validate', String(reply.value));
      }
    } catch (error) {
      // A save the student cancelled (JupyterLab asks before overwriting a file changed on
      // disk) rejects with a ModalCancelError: say what happened, not its name.
      const cancelled = error && (error.name === 'ModalCancelError' ||
        String(error.message || error) === 'Cancel');
      node = element('p', 'ctc-validate', cancelled ?
        'Validate stopped: the notebook was not saved (the save was cancelled). Save it, then ' +
        'press Validate again.' :
        `The notebook was not validated: ${error && error.message ? error.message : error}`);
    } finally {
      this.setLabel('Validate');
      this.busy = false;
    }
    await show(title, new Widget({ node }));
  }
}

// The keys a focused dropdown (an HTML select) answers without being opened.
const SELECT_KEYS = new Set(['ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'Home', 'End',
  'PageUp', 'PageDown']);

// In JupyterLab 4 the notebook's command mode takes the arrow keys of a focused ipywidgets
// dropdown: ArrowDown selects the next cell and scrolls the explorer away, the dropdown's value
// unchanged (jupyter-widgets/ipywidgets#3912, open). Caught on its way down to the dropdown,
// such a key goes no further as an event, so no shortcut sees it, and the browser still
// changes the dropdown's choice (its default action), which the widget then reports.
function keepSelectKeys(event) {
  const target = event.target;
  if (target instanceof HTMLSelectElement && target.closest('.jupyter-widgets') &&
      SELECT_KEYS.has(event.key) && !event.altKey && !event.ctrlKey && !event.metaKey) {
    event.stopPropagation();
  }
}

const plugin = {
  id: 'counting-the-cost-validate:button',
  description: "The course's Validate button in every notebook's toolbar, and the arrow keys " +
    "of the explorers' dropdowns kept for them.",
  autoStart: true,
  activate: app => {
    document.addEventListener('keydown', keepSelectKeys, true);
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: panel => {
        const button = new ValidateButton(panel);
        let index = 0; // where nbgrader put its button: before the toolbar's first spacer
        for (const item of panel.toolbar.children()) {
          if (!item || item.node.classList.contains('jp-Toolbar-spacer')) {
            break;
          }
          index++;
        }
        panel.toolbar.insertItem(index, 'ctc-validate', button);
        return button;
      }
    });
  }
};

export default plugin;
